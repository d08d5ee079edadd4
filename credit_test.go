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

// Rule: a sender waiting for credits is never left waiting for the
// receiver's batch of taken messages to fill. A chain that needs the
// whole cap, posted after one message was taken (its credit not given
// back yet: a batch is an eighth of the cap), once waited for ever: the
// ask found no room, and the one taken credit stayed with the receiver.
func TestCreditsWholeCapChain(t *testing.T) { eachProvider(t, testCreditsWholeCapChain) }

func testCreditsWholeCapChain(t *testing.T, opts []rdma.Option) {
	const cap = 16
	c, s := rdmatest.Pair(t, append(opts, rdma.WithQueueDepth(2*cap, cap))...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	recv := s.Recv()
	require.NoError(t, c.Send(b).Wait(ctx))
	require.NoError(t, recv.Wait(ctx))
	recv.Buffer().Release()

	batch := c.NewBatch()
	for range cap {
		batch.Send(b)
	}
	sent := batch.Post()
	for i := range cap {
		f := s.Recv()
		require.NoError(t, f.Wait(ctx), "message %d of the chain", i)
		f.Buffer().Release()
	}
	require.NoError(t, sent.Wait(ctx))
}

// Rule: beyond what it asks for, a connection gets no more than its share
// of the shared receive queue, so that credits given ahead do not leave
// the other connections waiting. 16 connections with a cap of 64 on an
// SRQ of 256 once gave the first ones 32, 28, 24 ... credits and left
// the last ones to wait for the first ones' idle credits to come back.
func TestCreditsShare(t *testing.T) {
	const conns, depth = 16, 256
	opts := []rdma.Option{rdma.WithProvider(rdma.ProviderSoft), rdma.WithQueueDepth(8, 64)}
	se, err := rdma.OpenEngine(append(opts, rdma.WithSharedReceives(depth))...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, se.Close()) }()
	ce, err := rdma.OpenEngine(opts...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ce.Close()) }()
	clients, servers := enginePairs(t, ce, se, conns)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, c := range clients {
		b, err := c.Alloc(64)
		require.NoError(t, err)
		require.NoError(t, c.Send(b).Wait(ctx), "conn %d", i)
		require.NoError(t, b.Release())
	}
	for i, s := range servers {
		f := s.Recv()
		require.NoError(t, f.Wait(ctx), "conn %d", i)
		f.Buffer().Release()
		st := s.Stats()
		assert.LessOrEqual(t, st.CreditsOut, int64(depth/conns), "conn %d holds more than its share of the SRQ", i)
	}
}
