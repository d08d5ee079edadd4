package stream_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/go-rdma/rdma/stream"
)

// silentListener is a TCP listener that accepts and never answers: a
// handshake with it runs out of time.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return ln.Addr().String()
}

// shortCtx is a context whose deadline passes soon.
func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

// Rule: every timeout of the stream is a net.Error whose Timeout() is
// true, as net's own are (the root package's TestTimeoutsAreNetErrors
// checks the async API's).
func TestTimeoutsAreNetErrors(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	bound := rdma.WithHandshakeTimeout(100 * time.Millisecond)
	cases := []struct {
		name string
		run  func(t *testing.T) error
	}{
		{"Dial handshake bound", func(t *testing.T) error {
			_, err := stream.Dial(context.Background(), "rdma", silentListener(t), soft, bound)
			return err
		}},
		{"Dial ctx deadline", func(t *testing.T) error {
			_, err := stream.Dial(shortCtx(t), "rdma", silentListener(t), soft)
			return err
		}},
		{"Dialer.Timeout", func(t *testing.T) error {
			d := stream.Dialer{Options: []rdma.Option{soft}, Timeout: 100 * time.Millisecond}
			_, err := d.Dial("rdma", silentListener(t))
			return err
		}},
		{"Dialer handshake bound", func(t *testing.T) error {
			d := stream.Dialer{Options: []rdma.Option{soft, bound}}
			_, err := d.DialContext(context.Background(), "tcp", silentListener(t))
			return err
		}},
		{"Dialer ctx deadline", func(t *testing.T) error {
			d := stream.Dialer{Options: []rdma.Option{soft}}
			_, err := d.DialContext(shortCtx(t), "rdma", silentListener(t))
			return err
		}},
		{"Listener.AcceptContext ctx deadline", func(t *testing.T) error {
			ln, err := stream.Listen("rdma", "127.0.0.1:0", soft)
			require.NoError(t, err)
			defer ln.Close()
			_, err = ln.(*stream.Listener).AcceptContext(shortCtx(t))
			return err
		}},
		{"stream Read deadline", func(t *testing.T) error {
			c, _ := rdmatest.StreamPair(t, soft)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
			_, err := c.Read(make([]byte, 10))
			return err
		}},
		{"stream Read past deadline", func(t *testing.T) error {
			c, _ := rdmatest.StreamPair(t, soft)
			require.NoError(t, c.SetDeadline(time.Now().Add(-time.Second)))
			_, err := c.Read(make([]byte, 10))
			return err
		}},
		{"stream Write deadline", func(t *testing.T) error {
			c, _ := rdmatest.StreamPair(t, soft) // the peer never reads: the window fills
			require.NoError(t, c.SetWriteDeadline(time.Now().Add(300*time.Millisecond)))
			_, err := c.Write(make([]byte, 16<<20))
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run(t)
			require.Error(t, err)
			assert.True(t, errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded),
				"matches a deadline: %v", err)
			var ne net.Error
			require.True(t, errors.As(err, &ne), "a net.Error: %v", err)
			assert.True(t, ne.Timeout(), "Timeout(): %v", err)
			var oe *net.OpError
			if errors.As(err, &oe) {
				assert.True(t, oe.Timeout(), "(*net.OpError).Timeout(): %#v", oe.Err)
			}
		})
	}
}

// Rule: a dial or accept that fails returns a nil interface, not one
// holding a nil pointer, so that `if conn != nil { conn.Close() }` is
// safe.
func TestFailedDialIsNilInterface(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	bound := rdma.WithHandshakeTimeout(100 * time.Millisecond)
	addr := silentListener(t)
	nc, err := stream.Dial(context.Background(), "rdma", addr, soft, bound)
	require.Error(t, err)
	assert.True(t, nc == nil, "Dial: %#v", nc)
	sl, err := stream.Listen("rdma", "127.0.0.1:0", soft)
	require.NoError(t, err)
	defer sl.Close()
	nc, err = stream.Dial(context.Background(), "rdma", sl.Addr().String(), soft, rdma.WithQueueDepth(2, 2))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	assert.True(t, nc == nil, "Dial, bad options: %#v", nc)

	d := stream.Dialer{Options: []rdma.Option{soft, bound}}
	nc, err = d.DialContext(context.Background(), "rdma", addr)
	require.Error(t, err)
	assert.True(t, nc == nil, "Dialer.DialContext: %#v", nc)
	nc, err = d.Dial("rdma", addr)
	require.Error(t, err)
	assert.True(t, nc == nil, "Dialer.Dial: %#v", nc)

	nl, err := stream.Listen("rdma", "127.0.0.1:0", soft, rdma.WithQueueDepth(2, 2))
	require.Error(t, err)
	assert.True(t, nl == nil, "Listen: %#v", nl)
	nl, err = stream.Listen("rdma", "256.0.0.1:0", soft)
	require.Error(t, err)
	assert.True(t, nl == nil, "Listen: %#v", nl)

	nl, err = stream.Listen("rdma", "127.0.0.1:0", soft)
	require.NoError(t, err)
	require.NoError(t, nl.Close())
	nc, err = nl.Accept()
	require.Error(t, err)
	assert.True(t, nc == nil, "Accept: %#v", nc)
}

// Rule: Dialer.Timeout bounds a dial as net.Dialer's does: a listener
// that never answers the handshake ends the dial with an error matching
// context.DeadlineExceeded, in about the timeout.
func TestDialerTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // silent: never answers
		}
	}()
	d := stream.Dialer{Options: []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)}, Timeout: 200 * time.Millisecond}
	start := time.Now()
	_, err = d.DialContext(context.Background(), "rdma", ln.Addr().String())
	require.Error(t, err)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.Less(t, time.Since(start), 5*time.Second)

	d.Timeout = -time.Second
	_, err = d.DialContext(context.Background(), "rdma", ln.Addr().String())
	require.ErrorIs(t, err, rdma.ErrInvalid)
}
