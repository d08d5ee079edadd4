package rdma_test

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

// Rule: every timeout of the async API and of the stream is a net.Error
// whose Timeout() is true, as net's own are, so that retry code written
// for net treats it as a timeout; a *net.OpError says so itself. It still
// matches os.ErrDeadlineExceeded or context.DeadlineExceeded.
func TestTimeoutsAreNetErrors(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	bound := rdma.WithHandshakeTimeout(100 * time.Millisecond)
	cases := []struct {
		name string
		run  func(t *testing.T) error
	}{
		{"Dial handshake bound", func(t *testing.T) error {
			_, err := rdma.Dial(context.Background(), "rdma", silentListener(t), soft, bound)
			return err
		}},
		{"Dial ctx deadline", func(t *testing.T) error {
			_, err := rdma.Dial(shortCtx(t), "rdma", silentListener(t), soft)
			return err
		}},
		{"Engine.Dial handshake bound", func(t *testing.T) error {
			e, err := rdma.OpenEngine(soft)
			require.NoError(t, err)
			defer e.Close()
			_, err = e.Dial(context.Background(), "rdma", silentListener(t), bound)
			return err
		}},
		{"Engine.Dial ctx deadline", func(t *testing.T) error {
			e, err := rdma.OpenEngine(soft)
			require.NoError(t, err)
			defer e.Close()
			_, err = e.Dial(shortCtx(t), "rdma", silentListener(t))
			return err
		}},
		{"Listener.Accept ctx deadline", func(t *testing.T) error {
			ln, err := rdma.Listen("rdma", "127.0.0.1:0", soft)
			require.NoError(t, err)
			defer ln.Close()
			_, err = ln.Accept(shortCtx(t))
			return err
		}},
		{"Future.Wait ctx deadline", func(t *testing.T) error {
			_, s := rdmatest.Pair(t, soft)
			f := s.Recv()
			err := f.Wait(shortCtx(t))
			f.Cancel()
			return err
		}},
		{"RecvRegion ctx deadline", func(t *testing.T) error {
			_, s := rdmatest.Pair(t, soft)
			_, err := s.RecvRegion(shortCtx(t))
			return err
		}},
		{"RequestRegion ctx deadline", func(t *testing.T) error {
			c, s := rdmatest.Pair(t, soft)
			rdma.Deafen(s)
			_, err := c.RequestRegion(shortCtx(t), 4096, rdma.RemoteWrite)
			return err
		}},
		{"Revoke ctx deadline", func(t *testing.T) error {
			c, s := rdmatest.Pair(t, soft)
			rdma.Deafen(c)
			b, err := s.Alloc(4096)
			require.NoError(t, err)
			t.Cleanup(func() { b.Release() })
			r, err := s.Expose(b, rdma.RemoteWrite)
			require.NoError(t, err)
			return s.Revoke(shortCtx(t), r)
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
