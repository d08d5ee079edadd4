package rdma_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

var auto = rdma.WithProvider(rdma.ProviderAuto)

// soft0 makes auto pick the soft provider where a verbs device is usable
// too (the VM): that side then has no device, as on a host without one,
// and the fallback's cases run everywhere.
var soft0 = rdma.WithDevice("soft0")

// fallbackPair dials a listener of lopts with dopts and returns both
// ends, or the dial's error.
func fallbackPair(t *testing.T, dopts, lopts []rdma.Option) (c, s *rdma.Conn, err error) {
	t.Helper()
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", lopts...)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err = rdma.Dial(ctx, "rdma", ln.Addr().String(), dopts...)
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() { c.Close() })
	s, err = ln.Accept(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return c, s, nil
}

// TestTCPFallbackNegotiation: a connection falls back only when both
// sides allow it and one of them has no device; a named provider, or
// the fallback off on either side, keeps the RDMA connection of today,
// and a side with a device and one without refuse each other then.
func TestTCPFallbackNegotiation(t *testing.T) {
	on, off := rdma.WithTCPFallback(true), rdma.WithTCPFallback(false)
	soft := rdma.WithProvider(rdma.ProviderSoft)
	for _, tc := range []struct {
		name                   string
		dial, listen           []rdma.Option
		dialerDev, listenerDev bool // the side's hello claims a device
		want                   string
	}{
		{name: "both allow", dial: []rdma.Option{auto, soft0, on}, listen: []rdma.Option{auto, soft0, on}, want: "TCP"},
		{name: "default off", dial: []rdma.Option{auto, soft0}, listen: []rdma.Option{auto, soft0}, want: "RC"},
		{name: "dialer off", dial: []rdma.Option{auto, soft0, on, off}, listen: []rdma.Option{auto, soft0, on}, want: "RC"},
		{name: "listener off", dial: []rdma.Option{auto, soft0, on}, listen: []rdma.Option{auto, soft0, off}, want: "RC"},
		{name: "dialer soft named", dial: []rdma.Option{soft, on}, listen: []rdma.Option{auto, soft0, on}, want: "RC"},
		{name: "listener soft named", dial: []rdma.Option{auto, soft0, on}, listen: []rdma.Option{soft, on}, want: "RC"},
		{name: "listener has a device", dial: []rdma.Option{auto, soft0, on}, listen: []rdma.Option{auto, soft0, on}, listenerDev: true, want: "TCP"},
		{name: "dialer has a device", dial: []rdma.Option{auto, soft0, on}, listen: []rdma.Option{auto, soft0, on}, dialerDev: true, want: "TCP"},
		{name: "listener has a device, no fallback", dial: []rdma.Option{auto, soft0, on}, listen: []rdma.Option{auto, soft0, off}, listenerDev: true, want: "refused"},
		{name: "dialer has a device, no fallback", dial: []rdma.Option{auto, soft0, off}, listen: []rdma.Option{auto, soft0, on}, dialerDev: true, want: "refused"},
		{name: "both have devices", dial: []rdma.Option{auto, soft0, on}, listen: []rdma.Option{auto, soft0, on}, dialerDev: true, listenerDev: true, want: "RC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer rdma.ClaimDevice(tc.dialerDev, tc.listenerDev)()
			c, s, err := fallbackPair(t, tc.dial, tc.listen)
			if tc.want == "refused" {
				require.ErrorIs(t, err, rdma.ErrRefused)
				assert.ErrorContains(t, err, "verbs")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, c.Transport().String(), "dialer")
			assert.Equal(t, tc.want, s.Transport().String(), "listener")
			assert.Equal(t, tc.want == "TCP", c.NetConn() != nil)
			assert.Equal(t, tc.want == "TCP", s.NetConn() != nil)
			require.NoError(t, c.Close())
			require.NoError(t, s.Close())
		})
	}
}

// TestTCPFallbackBytes: the bytes go over NetConn both ways, and those
// the listener writes at once are not lost in the dialer's handshake
// reader, which read them with the answer.
func TestTCPFallbackBytes(t *testing.T) {
	opts := []rdma.Option{auto, soft0, rdma.WithTCPFallback(true)}
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer ln.Close()
	before := ln.PoolStats()

	// The dialer reads the answer only once the listener's first bytes
	// are on the socket: its reader takes both in one read.
	written := make(chan struct{})
	defer rdma.BeforeAnswer(func() { <-written })()
	accepted := make(chan *rdma.Conn, 1)
	go func() {
		defer close(written)
		s, err := ln.Accept(context.Background())
		if !assert.NoError(t, err) {
			return
		}
		accepted <- s
		_, err = s.NetConn().Write([]byte("first bytes"))
		assert.NoError(t, err)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), opts...)
	require.NoError(t, err)
	defer c.Close()
	s := <-accepted
	defer s.Close()

	require.Equal(t, rdma.TCP, c.Transport())
	assert.True(t, rdma.ReadAhead(c), "the handshake's reader held the first bytes")
	nc := c.NetConn()
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(10*time.Second)))
	got := make([]byte, len("first bytes"))
	_, err = io.ReadFull(nc, got)
	require.NoError(t, err)
	assert.Equal(t, "first bytes", string(got))

	_, err = nc.Write([]byte("back"))
	require.NoError(t, err)
	got = make([]byte, 4)
	_, err = io.ReadFull(s.NetConn(), got)
	require.NoError(t, err)
	assert.Equal(t, "back", string(got))

	// CloseWrite through the wrapper: EOF at the peer.
	require.NoError(t, nc.(interface{ CloseWrite() error }).CloseWrite())
	n, err := s.NetConn().Read(got)
	assert.Equal(t, 0, n)
	assert.ErrorIs(t, err, io.EOF)

	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	select {
	case <-c.Done():
	default:
		t.Fatal("Done open after Close")
	}
	assert.ErrorIs(t, c.Err(), rdma.ErrClosed)
	_, err = nc.Read(got)
	assert.ErrorIs(t, err, net.ErrClosed)
	assert.Equal(t, before.BuffersInUse, ln.PoolStats().BuffersInUse)
}

// TestTCPFallbackRefusesRDMA: every RDMA operation of a connection that
// fell back fails at the call, naming TCP; the connection and its
// socket stay usable, and Abort resets the socket.
func TestTCPFallbackRefusesRDMA(t *testing.T) {
	opts := []rdma.Option{auto, soft0, rdma.WithTCPFallback(true)}
	c, s, err := fallbackPair(t, opts, opts)
	require.NoError(t, err)
	require.Equal(t, rdma.TCP, c.Transport())
	assert.Equal(t, "TCP", rdma.TCP.String())
	assert.Equal(t, rdma.ConnStats{}, c.Stats())
	assert.False(t, c.Credited())

	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	r := rdma.RemoteRegion{Addr: 8, RKey: 1, Len: 64}
	ctx := context.Background()
	notSupported := func(what string, err error) {
		t.Helper()
		assert.ErrorIs(t, err, rdma.ErrNotSupported, what)
		assert.ErrorContains(t, err, "TCP", what)
	}
	notSupported("Send", c.Send(b).Wait(ctx))
	notSupported("SendWithImm", c.SendWithImm(b, 1).Wait(ctx))
	notSupported("Recv", c.Recv().Wait(ctx))
	notSupported("Write", c.Write(b, r).Wait(ctx))
	notSupported("WriteWithImm", c.WriteWithImm(b, r, 1).Wait(ctx))
	notSupported("Read", c.Read(b, r).Wait(ctx))
	notSupported("CompareAndSwap", c.CompareAndSwap(r, 0, 1).Wait(ctx))
	notSupported("FetchAdd", c.FetchAdd(r, 1).Wait(ctx))
	_, err = c.Expose(b, rdma.RemoteRead)
	notSupported("Expose", err)
	notSupported("Revoke", c.Revoke(ctx, r))
	notSupported("RevokeNow", c.RevokeNow(r))
	_, err = c.RequestRegion(ctx, 64, rdma.RemoteWrite)
	notSupported("RequestRegion", err)
	notSupported("ReleaseRegion", c.ReleaseRegion(ctx, r))
	notSupported("SendRegion", c.SendRegion(ctx, r))
	_, err = c.RecvRegion(ctx)
	notSupported("RecvRegion", err)
	batch := c.NewBatch()
	batch.Send(b)
	batch.Write(b, r)
	notSupported("Batch", batch.Post().Wait(ctx))
	require.NoError(t, c.Err(), "refusals leave the connection up")

	// Abort resets the socket: the peer's read fails at once.
	require.NoError(t, c.Abort(errors.New("test abort")))
	require.NoError(t, s.NetConn().SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = s.NetConn().Read(make([]byte, 1))
	require.Error(t, err)
	assert.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.ErrorContains(t, c.Err(), "test abort")
}

// TestTCPFallbackEngine: the option works on an Engine's Dial and
// Listen too, and the Conn holds the engine until its Close.
func TestTCPFallbackEngine(t *testing.T) {
	x, err := rdma.OpenEngine(auto, soft0)
	require.NoError(t, err)
	defer x.Close()
	ln, err := x.Listen("rdma", "127.0.0.1:0", rdma.WithTCPFallback(true))
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan *rdma.Conn, 1)
	go func() {
		s, _ := ln.Accept(context.Background())
		accepted <- s
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := x.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithTCPFallback(true))
	require.NoError(t, err)
	s := <-accepted
	require.NotNil(t, s)
	assert.Equal(t, rdma.TCP, c.Transport())
	assert.Equal(t, rdma.TCP, s.Transport())
	assert.Equal(t, x.Provider(), c.Provider())
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	require.NoError(t, ln.Close())
	require.NoError(t, x.Close())
	_, err = c.Alloc(64)
	assert.ErrorIs(t, err, rdma.ErrClosed)
}
