package rdma_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// siwAddrs are the addresses of the VM's siw (soft-iWARP) devices.
func siwAddrs(t *testing.T) (ip0, ip1 string) {
	requireDevice(t)
	ip0, ip1 = os.Getenv("RDMA_VM_SIW_IP0"), os.Getenv("RDMA_VM_SIW_IP1")
	if ip0 == "" || ip1 == "" {
		if os.Getenv("RDMA_VM") == "1" {
			t.Fatal("RDMA_VM_SIW_IP0/RDMA_VM_SIW_IP1 unset: the VM has siw0/siw1")
		}
		t.Skip("the iWARP tests run in the VM harness, which sets RDMA_VM_SIW_IP0 and RDMA_VM_SIW_IP1")
	}
	return ip0, ip1
}

// Rule: on an iWARP device (siw) what the device cannot do fails at the
// call with ErrNotSupported naming the feature: Dial and Listen without
// WithRDMACM (an iWARP QP connects only through rdma_cm), WRITE and SEND
// with immediate data, single and batched, and atomics (atomic_cap NONE).
// Over rdma_cm the rest works: SEND and RDMA WRITE move the data.
func TestVerbsIWARPNotSupported(t *testing.T) {
	ip0, ip1 := siwAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	_, err := rdma.Listen("rdma", ip0+":0")
	require.ErrorIs(t, err, rdma.ErrNotSupported, "Listen on siw0's address without WithRDMACM")
	assert.Contains(t, err.Error(), "WithRDMACM")
	// A plain TCP listener, so that only the device can refuse the Dial.
	tl, err := net.Listen("tcp", ip1+":0")
	require.NoError(t, err)
	defer tl.Close()
	// The VM's policy routing makes siw0's address the local one.
	_, err = rdma.Dial(ctx, "rdma", tl.Addr().String())
	require.ErrorIs(t, err, rdma.ErrNotSupported, "Dial from siw0's address without WithRDMACM")
	assert.Contains(t, err.Error(), "rdma_cm")

	// iWARP has no UC, and rdma_cm connections are RC.
	_, err = rdma.Listen("rdma", ip1+":0", rdma.WithRDMACM(), rdma.WithTransport(rdma.UC))
	require.ErrorIs(t, err, rdma.ErrNotSupported, "Listen WithTransport(UC) on siw")
	assert.Contains(t, err.Error(), "UC")

	ln, err := rdma.Listen("rdma", ip1+":0", rdma.WithRDMACM())
	require.NoError(t, err)
	defer ln.Close()
	acc := make(chan *rdma.Conn, 1)
	go func() { c, _ := ln.Accept(ctx); acc <- c }()
	c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithRDMACM())
	require.NoError(t, err)
	defer c.Close()
	s := <-acc
	require.NotNil(t, s, "nothing accepted")
	defer s.Close()
	assert.Contains(t, []string{"siw0", "siw1"}, c.Device())

	target, err := s.Alloc(4096)
	require.NoError(t, err)
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite|rdma.RemoteAtomic)
	require.NoError(t, err)
	msg, err := s.Alloc(64)
	require.NoError(t, err)
	defer msg.Release()
	enc, err := region.MarshalBinary()
	require.NoError(t, err)
	copy(msg.Bytes(), enc)
	msg.SetLen(len(enc))
	r := c.Recv()
	wait(t, s.Send(msg))
	wait(t, r)
	var got rdma.RemoteRegion
	require.NoError(t, got.UnmarshalBinary(r.Buffer().Bytes()))
	r.Buffer().Release()

	src, err := c.Alloc(4096)
	require.NoError(t, err)
	defer src.Release()
	copy(src.Bytes(), bytes.Repeat([]byte("iw"), 2048))
	notSupported := func(what string, f *rdma.Future) {
		t.Helper()
		err := f.Wait(ctx)
		require.ErrorIs(t, err, rdma.ErrNotSupported, what)
		t.Logf("%s: %v", what, err)
	}
	notSupported("WriteWithImm", c.WriteWithImm(src, got, 7))
	notSupported("SendWithImm", c.SendWithImm(src, 7))
	notSupported("FetchAdd", c.FetchAdd(got, 1))
	notSupported("CompareAndSwap", c.CompareAndSwap(got, 0, 1))
	b := c.NewBatch()
	b.Write(src, got)
	b.WriteWithImm(src, got, 7)
	notSupported("a batch with a WRITE_WITH_IMM", b.Post())
	wait(t, c.Write(src, got))
	assert.Equal(t, src.Bytes(), target.Bytes(), "WRITE over rdma_cm on siw")
}
