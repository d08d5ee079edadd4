package rdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: posting past a full send queue never blocks the caller: the
// operation waits behind an unresolved Future, in order, whose Wait
// honours its context, and goes out when completions make room.
func TestPostsNeverBlock(t *testing.T) { eachProvider(t, testPostsNeverBlock) }

func testPostsNeverBlock(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithQueueDepth(4, 16))...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := c.Alloc(8)
	require.NoError(t, err)
	defer b.Release()
	// The server takes no message yet: past its 16 receives the sends
	// stall in the send queue (receiver not ready), 4 at a time, and the
	// rest must queue without blocking this goroutine.
	const n = 40
	var fs []*rdma.Future
	issued := make(chan struct{})
	go func() {
		defer close(issued)
		for range n {
			fs = append(fs, c.Send(b))
		}
	}()
	select {
	case <-issued:
	case <-ctx.Done():
		t.Fatal("Send blocked on a full send queue")
	}
	last := fs[n-1]
	short, stop := context.WithTimeout(ctx, 20*time.Millisecond)
	require.ErrorIs(t, last.Wait(short), context.DeadlineExceeded, "the last send cannot have gone out yet")
	stop()
	for i := range n {
		r := s.Recv()
		require.NoError(t, r.Wait(ctx), "message %d", i)
		require.NoError(t, r.Buffer().Release())
	}
	for i, f := range fs {
		require.NoError(t, f.Wait(ctx), "send %d", i)
	}
}
