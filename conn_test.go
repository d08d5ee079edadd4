package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// wait waits (bounded) for f to resolve and requires it to succeed.
func wait(t *testing.T, f *rdma.Future) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, f.Wait(ctx))
}

// Rule: Send delivers the bytes in a pool buffer to the peer's Recv,
// with its immediate; the sender may release its buffer at once.
func TestSendRecv(t *testing.T) { eachProvider(t, testSendRecv) }

func testSendRecv(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	for _, n := range []int{1, 64, 4096, 60000} {
		b, err := c.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range b.Bytes() {
			b.Bytes()[i] = byte(i * 7)
		}
		want := bytes.Clone(b.Bytes())
		rf := s.Recv()
		sf := c.SendWithImm(b, uint32(n))
		b.Release()
		wait(t, sf)
		wait(t, rf)
		got := rf.Buffer()
		if got == nil || !bytes.Equal(got.Bytes(), want) || rf.Len() != n {
			t.Fatalf("%d bytes: received %d bytes, differ", n, rf.Len())
		}
		if imm, ok := rf.Imm(); !ok || imm != uint32(n) {
			t.Errorf("imm = %d, %v", imm, ok)
		}
		got.Release()
	}
}

// Rule: WRITE and READ move bytes to and from an exposed region, and
// atomics return the old value.
func TestOneSided(t *testing.T) { eachProvider(t, testOneSided) }

func testOneSided(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	target, err := s.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteRead|rdma.RemoteWrite|rdma.RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.SendRegion(ctx, region); err != nil {
		t.Fatal(err)
	}
	r, err := c.RecvRegion(ctx)
	if err != nil || r != region {
		t.Fatalf("RecvRegion = %v, %v; want %v", r, err, region)
	}
	src, _ := c.Alloc(100)
	defer src.Release()
	copy(src.Bytes(), bytes.Repeat([]byte("go-rdma!"), 13))
	sub, err := r.Slice(1000, 100)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, c.Write(src, sub))
	if !bytes.Equal(target.Bytes()[1000:1100], src.Bytes()) {
		t.Fatal("WRITE data differs")
	}
	dst, _ := c.Alloc(100)
	defer dst.Release()
	wait(t, c.Read(dst, sub))
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("READ data differs")
	}
	word, _ := r.Slice(4096, 8)
	f := c.FetchAdd(word, 5)
	wait(t, f)
	f = c.CompareAndSwap(word, 5, 42)
	wait(t, f)
	if f.Old() != 5 {
		t.Fatalf("CAS old = %d, want 5", f.Old())
	}
	f = c.FetchAdd(word, 1)
	wait(t, f)
	if f.Old() != 42 {
		t.Fatalf("FAA old = %d, want 42", f.Old())
	}
	// An orderly revoke: the peer refuses new accesses itself, and the
	// connection stays up.
	if err := s.Revoke(ctx, region); err != nil {
		t.Fatal(err)
	}
	err = c.Write(src, sub).Wait(ctx)
	if !errors.Is(err, rdma.ErrRegionRevoked) {
		t.Fatalf("write to a revoked region: %v, want ErrRegionRevoked", err)
	}
	wait(t, c.Write(src, reg2(t, ctx, s, c)))
	// An emergency revoke: the next access is a remote access error,
	// which breaks the connection.
	region = reg2(t, ctx, s, c)
	if err := s.RevokeNow(region); err != nil {
		t.Fatal(err)
	}
	err = c.Write(src, region).Wait(ctx)
	if !errors.Is(err, rdma.ErrRemoteAccess) {
		t.Fatalf("write to a region revoked at once: %v, want ErrRemoteAccess", err)
	}
	if err := c.Send(src).Wait(ctx); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("send after a failed completion: %v, want one that reports a closed connection", err)
	}
}

// reg2 exposes a fresh 4 KiB buffer of s for writing and hands it to c.
func reg2(t *testing.T, ctx context.Context, s, c *rdma.Conn) rdma.RemoteRegion {
	t.Helper()
	b, err := s.Alloc(4096)
	require.NoError(t, err)
	t.Cleanup(func() { b.Release() })
	r, err := s.Expose(b, rdma.RemoteWrite)
	require.NoError(t, err)
	require.NoError(t, s.SendRegion(ctx, r))
	got, err := c.RecvRegion(ctx)
	require.NoError(t, err)
	require.Equal(t, r, got)
	return got
}
