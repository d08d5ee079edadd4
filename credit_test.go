package rdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: a peer that never takes a message gets no more than it has
// receives for: the sender's messages past its credits wait (no
// receiver-not-ready retries), and both sides' Close returns within a
// second and resolves everything.
func TestCreditsBackPressure(t *testing.T) { eachProvider(t, testCreditsBackPressure) }

func testCreditsBackPressure(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithQueueDepth(128, 16))...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	var fs []*rdma.Future
	for range 100 {
		fs = append(fs, c.Send(b))
	}
	for i, f := range fs[:16] {
		require.NoError(t, f.Wait(ctx), "send %d had a credit", i)
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	require.ErrorIs(t, fs[16].Wait(short), context.DeadlineExceeded, "a send past the credits went out")
	stop()
	for _, f := range fs[16:] {
		require.False(t, f.Resolved())
	}

	start := time.Now()
	require.NoError(t, c.Close())
	assert.Less(t, time.Since(start), time.Second, "the sender's Close")
	for i, f := range fs[16:] {
		require.ErrorIs(t, f.Wait(ctx), rdma.ErrClosed, "send %d", 16+i)
	}
	start = time.Now()
	require.NoError(t, s.Close())
	assert.Less(t, time.Since(start), time.Second, "the receiver's Close")
}

// Rule: credits come back as the receiver takes messages, so a long run
// of messages through a shallow receive queue all arrive, in order.
func TestCreditsReturn(t *testing.T) { eachProvider(t, testCreditsReturn) }

func testCreditsReturn(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithQueueDepth(8, 4))...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 2000
	errc := make(chan error, 1)
	go func() {
		b, err := c.Alloc(4)
		if err != nil {
			errc <- err
			return
		}
		defer b.Release()
		var last *rdma.Future
		for i := range n {
			last = c.SendWithImm(b, uint32(i))
		}
		errc <- last.Wait(ctx)
	}()
	for i := range n {
		r := s.Recv()
		require.NoError(t, r.Wait(ctx), "message %d", i)
		imm, ok := r.Imm()
		require.True(t, ok)
		require.Equal(t, uint32(i), imm, "in order")
		require.NoError(t, r.Buffer().Release())
	}
	require.NoError(t, <-errc)
}
