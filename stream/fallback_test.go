package stream_test

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
	"golang.org/x/net/nettest"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/go-rdma/rdma/stream"
)

// auto is the provider the stream falls back with: the default, named
// so that $RDMA_PROVIDER does not change what the tests test.
var auto = rdma.WithProvider(rdma.ProviderAuto)

// soft0 makes auto pick the soft provider where a verbs device is usable
// too (the VM): that side then has no device, as on a host without one,
// and the fallback's cases run everywhere.
var soft0 = rdma.WithDevice("soft0")

// hostOpts are no options on a host without a usable verbs device, and
// soft0 where there is one (the VM), so that the defaults are tested as
// a host without a device has them.
func hostOpts(t *testing.T) []rdma.Option {
	t.Helper()
	devs, err := rdma.Devices()
	require.NoError(t, err)
	for _, d := range devs {
		if d.Provider == rdma.ProviderVerbs && d.Usable {
			return []rdma.Option{soft0}
		}
	}
	return nil
}

// TestStreamFallbackDefaults: with the defaults (no option, the auto
// provider, no device here) a stream falls back to TCP on both ends,
// says so, and carries bytes both ways; WithTCPFallback(false) keeps it
// on (soft) RDMA.
func TestStreamFallbackDefaults(t *testing.T) {
	t.Setenv("RDMA_PROVIDER", "")
	c, s := rdmatest.StreamPair(t, hostOpts(t)...)
	for _, x := range []*stream.Conn{c, s} {
		assert.Equal(t, rdma.TCP, x.Transport())
		assert.Nil(t, x.RDMAConn())
	}
	_, err := c.Write([]byte("ping"))
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(s, got)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(got))
	assert.Equal(t, c.LocalAddr().String(), s.RemoteAddr().String())

	c, s = rdmatest.StreamPair(t, append(hostOpts(t), rdma.WithTCPFallback(false))...)
	assert.Equal(t, rdma.RC, c.Transport())
	assert.Equal(t, rdma.RC, s.Transport())
	require.NotNil(t, c.RDMAConn())
	assert.Equal(t, rdma.ProviderSoft, c.RDMAConn().Provider())
}

// TestStreamFallbackNettest runs x/net/nettest's conformance suite over
// streams that fell back to TCP.
func TestStreamFallbackNettest(t *testing.T) {
	nettest.TestConn(t, makeStreamPipe("127.0.0.1:0", []rdma.Option{auto, soft0}))
}

// TestStreamFallbackConn: a stream over TCP keeps the net.Conn contract
// of one over RDMA: deadlines, CloseWrite (EOF at the peer), Close
// unblocking a Read, net.ErrClosed after Close, ReadFrom and WriteTo.
func TestStreamFallbackConn(t *testing.T) {
	c, s := rdmatest.StreamPair(t, auto, soft0)
	require.Equal(t, rdma.TCP, c.Transport())

	// A deadline in the past fails a Read at once; cleared, it reads.
	require.NoError(t, s.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err := s.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	require.NoError(t, s.SetDeadline(time.Time{}))

	// ReadFrom and WriteTo carry a body, CloseWrite ends it.
	body := make([]byte, 1<<20)
	for i := range body {
		body[i] = byte(i * 7)
	}
	sent := make(chan error, 1)
	go func() {
		r := bytesReader(body)
		_, err := c.ReadFrom(&r)
		if err == nil {
			err = c.CloseWrite()
		}
		sent <- err
	}()
	var sink sliceWriter
	n, err := s.WriteTo(&sink)
	require.NoError(t, err)
	require.NoError(t, <-sent)
	assert.Equal(t, int64(len(body)), n)
	assert.Equal(t, body, []byte(sink))
	// The other way still works after the half close.
	_, err = s.Write([]byte("back"))
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)

	// Close unblocks a pending Read; later Reads match net.ErrClosed.
	read := make(chan error, 1)
	go func() {
		_, err := c.Read(got)
		read <- err
	}()
	require.NoError(t, c.Close())
	select {
	case err := <-read:
		assert.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not unblock Read")
	}
	_, err = c.Read(got)
	assert.ErrorIs(t, err, net.ErrClosed)
	var oe *net.OpError
	assert.ErrorAs(t, err, &oe)
	assert.NoError(t, c.Close(), "Close twice")
	// The peer reads EOF.
	_, err = s.Read(got)
	assert.ErrorIs(t, err, io.EOF)
}

// TestStreamFallbackTLS: WithTLS with the fallback: the bytes go over
// the TLS session, whose state each end reports.
func TestStreamFallbackTLS(t *testing.T) {
	p := newTestPKI(t)
	ln, err := stream.Listen("rdma", "127.0.0.1:0", auto, soft0, rdma.WithTLS(p.serverTLS()))
	require.NoError(t, err)
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		s, _ := ln.Accept()
		acc <- s
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, err := stream.Dial(ctx, "rdma", ln.Addr().String(), auto, soft0, rdma.WithTLS(p.clientTLS(p.client)))
	require.NoError(t, err)
	defer nc.Close()
	sc := <-acc
	require.NotNil(t, sc)
	defer sc.Close()
	c, s := nc.(*stream.Conn), sc.(*stream.Conn)
	require.Equal(t, rdma.TCP, c.Transport())
	require.Equal(t, rdma.TCP, s.Transport())
	assert.Equal(t, "server", peerName(t, c.ConnectionState))
	assert.Equal(t, "client", peerName(t, s.ConnectionState))
	_, err = s.Write([]byte("sealed"))
	require.NoError(t, err)
	got := make([]byte, 6)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "sealed", string(got))
}

// TestStreamFallbackAcceptCheck: the listener's accept check runs
// before a connection falls back, and its refusal is the dialer's
// error.
func TestStreamFallbackAcceptCheck(t *testing.T) {
	checked := make(chan rdma.PeerInfo, 1)
	ln, err := stream.Listen("rdma", "127.0.0.1:0", auto, soft0, rdma.WithAcceptCheck(func(p rdma.PeerInfo) error {
		checked <- p
		return errors.New("not on the list")
	}))
	require.NoError(t, err)
	defer ln.Close()
	go ln.Accept() // returns at Close
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = stream.Dial(ctx, "rdma", ln.Addr().String(), auto, soft0)
	require.ErrorIs(t, err, rdma.ErrRefused)
	assert.ErrorContains(t, err, "not on the list")
	<-checked
}

type sliceWriter []byte

func (w *sliceWriter) Write(p []byte) (int, error) {
	*w = append(*w, p...)
	return len(p), nil
}

type bytesReader []byte

func (r *bytesReader) Read(p []byte) (int, error) {
	if len(*r) == 0 {
		return 0, io.EOF
	}
	n := copy(p, *r)
	*r = (*r)[n:]
	return n, nil
}
