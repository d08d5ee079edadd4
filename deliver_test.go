package rdma_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: a handler server that closes its connection when Done closes
// loses no message that arrived: Done closes only after the handler has
// returned for every one (issue 17 item 1). The handler here holds every
// message until the client has closed, so they all wait at the end.
func TestDoneAfterHandled(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		const conns, msgs = 4, 32 // msgs within a connection's credits
		var got atomic.Int64
		gate := make(chan struct{})
		h := func(c *rdma.Conn, f *rdma.Future) {
			<-gate
			got.Add(1)
			f.Buffer().Release()
		}
		se, err := rdma.OpenEngine(engineOpts(opts)...)
		require.NoError(t, err)
		defer se.Close()
		ce, err := rdma.OpenEngine(engineOpts(opts)...)
		require.NoError(t, err)
		defer ce.Close()
		ln, err := se.Listen("rdma", "127.0.0.1:0", rdma.WithRecvHandler(h))
		require.NoError(t, err)
		defer ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		defer wg.Wait() // before the engines close
		for range conns {
			c, s := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
				return ce.Dial(ctx, "rdma", address)
			})
			wg.Add(1)
			go func() { // what WithRecvHandler's godoc says a server does
				defer wg.Done()
				<-s.Done()
				s.Close()
			}()
			b, err := c.Alloc(8)
			require.NoError(t, err)
			fs := make([]*rdma.Future, msgs)
			for i := range fs {
				fs[i] = c.Send(b)
			}
			for _, f := range fs {
				require.NoError(t, f.Wait(ctx))
			}
			require.NoError(t, b.Release())
			require.NoError(t, c.Close())
		}
		close(gate)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("a server connection's Done never closed")
		}
		require.EqualValues(t, conns*msgs, got.Load(), "messages handled of those whose Send succeeded")
	})
}

// Rule: Done closes only after the handler has returned, not merely
// after it was called: with the handler of the last message still
// running when everything else about the end has settled, Done stays
// open; it closes once the handler returns, and then every handler has
// returned.
func TestDoneWaitsForRunningHandler(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		const msgs = 8
		var returned atomic.Int64
		inLast, gate := make(chan struct{}), make(chan struct{})
		h := func(c *rdma.Conn, f *rdma.Future) {
			if imm, _ := f.Imm(); imm == msgs-1 {
				close(inLast)
				<-gate
			}
			f.Buffer().Release()
			returned.Add(1)
		}
		se, err := rdma.OpenEngine(engineOpts(opts)...)
		require.NoError(t, err)
		defer se.Close()
		ce, err := rdma.OpenEngine(engineOpts(opts)...)
		require.NoError(t, err)
		defer ce.Close()
		ln, err := se.Listen("rdma", "127.0.0.1:0", rdma.WithRecvHandler(h))
		require.NoError(t, err)
		defer ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, s := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
			return ce.Dial(ctx, "rdma", address)
		})
		defer s.Close()
		b, err := c.Alloc(8)
		require.NoError(t, err)
		fs := make([]*rdma.Future, msgs)
		for i := range fs {
			fs[i] = c.SendWithImm(b, uint32(i))
		}
		for _, f := range fs {
			require.NoError(t, f.Wait(ctx))
		}
		require.NoError(t, b.Release())
		select {
		case <-inLast:
		case <-ctx.Done():
			t.Fatal("the last message never reached the handler")
		}
		require.NoError(t, c.Close())
		require.Eventually(t, func() bool { return rdma.EndSettled(s) }, 10*time.Second, time.Millisecond,
			"the server's end never settled")
		select {
		case <-s.Done():
			close(gate)
			t.Fatal("Done closed while the handler of the last message still ran")
		default:
		}
		close(gate)
		select {
		case <-s.Done():
		case <-ctx.Done():
			t.Fatal("Done did not close after the handler returned")
		}
		require.EqualValues(t, msgs, returned.Load(), "handlers returned when Done closed")
	})
}

// Rule: like EOF after the data, Done of a Recv user closes only once
// Recv has taken every message that arrived; then Recv fails with why
// the connection ended.
func TestDoneAfterRecv(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		const msgs = 16
		c, s := rdmatest.Pair(t, opts...)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := c.Alloc(8)
		require.NoError(t, err)
		fs := make([]*rdma.Future, msgs)
		for i := range fs {
			fs[i] = c.SendWithImm(b, uint32(i))
		}
		for _, f := range fs {
			require.NoError(t, f.Wait(ctx))
		}
		require.NoError(t, b.Release())
		require.NoError(t, c.Close())
		require.Eventually(t, func() bool { return s.Err() != nil }, 10*time.Second, time.Millisecond, "the server did not hear the close")
		require.ErrorIs(t, s.Err(), rdma.ErrPeerClosed)
		for i := range msgs {
			select {
			case <-s.Done():
				t.Fatalf("Done closed with %d messages not taken", msgs-i)
			default:
			}
			r := s.Recv()
			require.NoError(t, r.Wait(ctx), "message %d", i)
			imm, _ := r.Imm()
			require.EqualValues(t, i, imm)
			require.NoError(t, r.Buffer().Release())
		}
		select {
		case <-s.Done():
		case <-ctx.Done():
			t.Fatal("Done did not close after the last message was taken")
		}
		require.ErrorIs(t, s.Recv().Wait(ctx), rdma.ErrPeerClosed)
	})
}
