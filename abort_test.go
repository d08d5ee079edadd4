package rdma_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: when a connection fails for a reason of its own (here a remote
// access error on the client), its peer learns of it at once: its
// pending Recv fails with ErrPeerClosed, the error says the peer's
// reason, and its Done closes (issue 17 item 3).
func TestPeerLearnsAbort(t *testing.T) {
	cases := []struct {
		name   string
		access rdma.Access
		op     func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future
	}{
		{"write to read-only", rdma.RemoteRead, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			return c.Write(l, r)
		}},
		{"write with imm to read-only", rdma.RemoteRead, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			return c.WriteWithImm(l, r, 7)
		}},
		{"read of write-only", rdma.RemoteWrite, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			return c.Read(l, r)
		}},
		{"write with forged rkey", rdma.RemoteRead | rdma.RemoteWrite, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			r.RKey ^= 0x5a5a00
			return c.Write(l, r)
		}},
		{"read with forged rkey", rdma.RemoteRead | rdma.RemoteWrite, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			r.RKey ^= 0x5a5a00
			return c.Read(l, r)
		}},
		{"write past the region", rdma.RemoteRead | rdma.RemoteWrite, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			r.Len = len(l.Bytes()) // forged: the region is 8 bytes
			return c.Write(l, r)
		}},
		{"read at a forged address", rdma.RemoteRead | rdma.RemoteWrite, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			r.Addr += 1 << 20
			return c.Read(l, r)
		}},
		{"fetch-add without RemoteAtomic", rdma.RemoteRead | rdma.RemoteWrite, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			return c.FetchAdd(r, 1)
		}},
		{"compare-and-swap without RemoteAtomic", rdma.RemoteRead | rdma.RemoteWrite, func(c *rdma.Conn, l *rdma.Buffer, r rdma.RemoteRegion) *rdma.Future {
			return c.CompareAndSwap(r, 0, 1)
		}},
	}
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				c, s := rdmatest.Pair(t, opts...)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				sb, err := s.Alloc(8)
				require.NoError(t, err)
				defer sb.Release()
				r, err := s.Expose(sb, tc.access)
				require.NoError(t, err)
				pending := s.Recv()
				// As long as the region, so the client's own check of
				// the length passes; "write past the region" forges Len.
				n := 8
				if tc.name == "write past the region" {
					n = 64
				}
				l, err := c.Alloc(n)
				require.NoError(t, err)
				defer l.Release()
				f := tc.op(c, l, r)
				ferr := f.Wait(ctx)
				require.Error(t, ferr, "the bad access succeeded")
				require.False(t, errors.Is(ferr, rdma.ErrInvalid), "refused locally: %v", ferr)
				select {
				case <-c.Done():
				case <-ctx.Done():
					t.Fatal("the failed client's Done did not close")
				}
				// The peer learns within a bound, with the client's reason.
				bound, cancelBound := context.WithTimeout(ctx, 10*time.Second)
				defer cancelBound()
				err = pending.Wait(bound)
				require.NotErrorIs(t, err, context.DeadlineExceeded, "the server's pending Recv is still unresolved")
				// Where the bad access took a receive here (a
				// WRITE_WITH_IMM on rxe), that receive fails by itself and
				// names the status; else the client's abort tells.
				var ce *rdma.CompletionError
				if !errors.As(err, &ce) || errors.Is(err, rdma.ErrPeerClosed) {
					require.ErrorIs(t, err, rdma.ErrPeerClosed)
					assert.Contains(t, err.Error(), "aborted")
				}
				assert.Contains(t, err.Error(), "REM_ACCESS_ERR", "the reason")
				select {
				case <-s.Done():
				case <-bound.Done():
					t.Fatal("the server's Done did not close")
				}
				assert.Contains(t, s.Err().Error(), "REM_ACCESS_ERR")
			})
		}
	})
}

// Rule: Abort fails the connection at once with the caller's cause and
// tells the peer, whose pending Recv fails with ErrPeerClosed naming the
// cause; Abort releases what the connection holds, as Close does.
func TestAbort(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		c, s := rdmatest.Pair(t, opts...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.ErrorIs(t, c.Abort(nil), rdma.ErrInvalid)
		require.NoError(t, c.Err(), "Abort(nil) ended the connection")
		peer, own := s.Recv(), c.Recv()
		cause := errors.New("the application gave up")
		require.NoError(t, c.Abort(cause))
		err := own.Wait(ctx)
		require.ErrorIs(t, err, rdma.ErrClosed)
		require.ErrorIs(t, err, cause)
		require.ErrorIs(t, c.Err(), cause)
		select {
		case <-c.Done():
		default:
			t.Fatal("Done is open after Abort returned")
		}
		err = peer.Wait(ctx)
		require.ErrorIs(t, err, rdma.ErrPeerClosed)
		assert.Contains(t, err.Error(), "the application gave up")
		select {
		case <-s.Done():
		case <-ctx.Done():
			t.Fatal("the peer's Done did not close")
		}
		require.NoError(t, c.Close())
		require.NoError(t, c.Abort(cause), "Abort after the end")
	})
}

// Rule: the peer's abort reason is bounded: a frame of the largest size
// the control channel allows ends the connection with ErrPeerClosed and
// a reason cut to a few hundred bytes, quoted.
func TestPeerAbortReasonBounded(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pending := s.Recv()
	long := make([]byte, 1024)
	for i := range long {
		long[i] = '\n'
	}
	require.NoError(t, rdma.SendControl(c, rdma.CtrlAbort, long))
	err := pending.Wait(ctx)
	require.ErrorIs(t, err, rdma.ErrPeerClosed)
	assert.Contains(t, err.Error(), "aborted")
	assert.NotContains(t, err.Error(), "\n", "the peer's text is quoted")
	assert.Less(t, len(err.Error()), 2*256+200)
}
