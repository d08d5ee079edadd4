package rdma

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeliverToResolvedWaiter: a message that finds its waiter resolved
// already goes back to the pool rather than nowhere. Before the fix the
// buffer was dropped and the engine, once closed, never drained: a
// goroutine waited on Drained for the rest of the process (goleak in
// TestMain found it, after a test had resolved a future in futurePool).
func TestDeliverToResolvedWaiter(t *testing.T) {
	x, err := OpenEngine(WithProvider(ProviderSoft))
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			x.Close()
		}
	}()
	ln, err := x.Listen("rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	acc := make(chan *Conn, 1)
	go func() { c, _ := ln.Accept(ctx); acc <- c }()
	c, err := x.Dial(ctx, "rdma", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	s := <-acc
	require.NotNil(t, s, "accept failed")
	defer s.Close()

	f := s.Recv()
	require.False(t, f.Resolved())
	require.True(t, f.resolve(errors.New("resolved by someone else"), 0, 0, false, nil, 0))
	buf, err := c.Alloc(8)
	require.NoError(t, err)
	require.NoError(t, c.Send(buf).Wait(ctx))
	buf.Release()
	// The message went to f, the oldest waiter: a second Recv gets the
	// next one, which proves the first is gone from the waiters.
	next := s.Recv()
	b2, err := c.Alloc(8)
	require.NoError(t, err)
	require.NoError(t, c.Send(b2).Wait(ctx))
	b2.Release()
	require.NoError(t, next.Wait(ctx))
	next.Buffer().Release()

	require.NoError(t, s.Close())
	require.NoError(t, c.Close())
	require.NoError(t, ln.Close())
	drained := x.e.Pool.Drained()
	closed = true
	require.NoError(t, x.Close())
	select {
	case <-drained:
	case <-ctx.Done():
		t.Fatalf("the engine did not drain: %d buffers in use", x.e.Pool.Stats().BuffersInUse)
	}
}
