package rdma_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: a Batch with more messages than the peer gives credits for at
// once is refused at Post with ErrInvalid, holding no buffer; nothing
// behind it waits. A 100-SEND batch at the default depths (send 128,
// credits 64) once delivered nothing and wedged a WRITE behind it.
func TestBatchPastCreditCap(t *testing.T) { eachProvider(t, testBatchPastCreditCap) }

func testBatchPastCreditCap(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	target, err := s.Alloc(64)
	require.NoError(t, err)
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite)
	require.NoError(t, err)
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	inUse := c.PoolStats().BuffersInUse

	batch := c.NewBatch()
	for range 100 {
		batch.Send(b)
	}
	f := batch.Post()
	require.True(t, f.Resolved(), "a batch the peer can never take must be refused at Post")
	require.ErrorIs(t, f.Err(), rdma.ErrInvalid)
	assert.Contains(t, f.Err().Error(), "100 messages")
	assert.Contains(t, f.Err().Error(), "64")
	assert.Contains(t, f.Err().Error(), c.RemoteAddr().String(), "the error names the conn")
	assert.Equal(t, inUse, c.PoolStats().BuffersInUse, "the refused batch holds buffers")

	// What comes after it goes out.
	require.NoError(t, c.Write(b, region).Wait(ctx), "a WRITE after the refused batch")
	// A batch of the whole cap is delivered.
	for range 64 {
		batch.SendWithImm(b, 7)
	}
	sent := batch.Post()
	for i := range 64 {
		r := s.Recv()
		require.NoError(t, r.Wait(ctx), "message %d of the whole-cap batch", i)
		require.NoError(t, r.Buffer().Release())
	}
	require.NoError(t, sent.Wait(ctx))
	assert.Equal(t, inUse, c.PoolStats().BuffersInUse)
}

// Rule: the credit cap a peer announces is what it can give at once: its
// receive depth, or its shared receive queue's depth when that is
// smaller. A batch past it is refused at Post; one within it is
// delivered. With an SRQ of 16 a 32-SEND batch (credits 64) once waited
// for ever.
func TestBatchPastSharedReceives(t *testing.T) {
	opts := []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)}
	se, err := rdma.OpenEngine(append(engineOpts(opts), rdma.WithSharedReceives(16))...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, se.Close()) }()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ce.Close()) }()
	clients, servers := enginePairs(t, ce, se, 1, opts...)
	c, s := clients[0], servers[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()

	batch := c.NewBatch()
	for range 32 {
		batch.Send(b)
	}
	f := batch.Post()
	require.True(t, f.Resolved(), "a batch past the peer's SRQ must be refused at Post")
	require.ErrorIs(t, f.Err(), rdma.ErrInvalid)
	assert.Contains(t, f.Err().Error(), "32 messages")

	for range 16 {
		batch.Send(b)
	}
	sent := batch.Post()
	for i := range 16 {
		r := s.Recv()
		require.NoError(t, r.Wait(ctx), "message %d", i)
		require.NoError(t, r.Buffer().Release())
	}
	require.NoError(t, sent.Wait(ctx))
}

// Rule: a WRITE queued behind a chain that waits for credits goes out
// once the credits come (the receiver takes its messages).
func TestWriteBehindCreditWait(t *testing.T) { eachProvider(t, testWriteBehindCreditWait) }

func testWriteBehindCreditWait(t *testing.T, opts []rdma.Option) {
	const cap = 16
	c, s := rdmatest.Pair(t, append(opts, rdma.WithQueueDepth(4*cap, cap))...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	target, err := s.Alloc(64)
	require.NoError(t, err)
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite)
	require.NoError(t, err)
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()

	batch := c.NewBatch()
	for range cap {
		batch.Send(b)
	}
	first := batch.Post()
	require.NoError(t, first.Wait(ctx), "the first whole-cap batch had the credits")
	for range cap {
		batch.Send(b)
	}
	second := batch.Post() // waits: the receiver took nothing yet
	write := c.Write(b, region)
	for i := range 2 * cap {
		r := s.Recv()
		require.NoError(t, r.Wait(ctx), "message %d", i)
		require.NoError(t, r.Buffer().Release())
	}
	require.NoError(t, second.Wait(ctx))
	require.NoError(t, write.Wait(ctx), "the WRITE behind the batch")
}

// Rule: a Batch the peer accepted at Post is delivered, however the
// connections sharing the peer's receive queue hold its credits. Two
// clients of a server with a shared receive queue of 64: A sends 40 and
// B 24, which leaves them holding the queue's 64 credits between them as
// the server takes the messages; then each posts a Batch of 64, the cap.
// Each used to keep what it held and wait for the rest, for ever (6 runs
// in 8).
func TestBatchSharedReceivesNoHoldAndWait(t *testing.T) {
	eachProvider(t, testBatchSharedReceivesNoHoldAndWait)
}

func testBatchSharedReceivesNoHoldAndWait(t *testing.T, opts []rdma.Option) {
	se, err := rdma.OpenEngine(append(engineOpts(opts), rdma.WithSharedReceives(64))...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, se.Close()) }()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ce.Close()) }()
	clients, accepted := enginePairs(t, ce, se, 2, opts...)
	servers := peers(t, clients, accepted)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bufs := make([]*rdma.Buffer, 2)
	for i, c := range clients {
		bufs[i], err = c.Alloc(64)
		require.NoError(t, err)
		defer bufs[i].Release()
	}
	// round posts a Batch of sizes[i] SENDs on client i, all at once,
	// and waits until the server took them and the Batches completed.
	round := func(sizes ...int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 2*len(sizes))
		for i, n := range sizes {
			b := clients[i].NewBatch()
			for range n {
				b.Send(bufs[i])
			}
			f := b.Post()
			wg.Go(func() {
				for k := range n {
					r := servers[i].Recv()
					if err := r.Wait(ctx); err != nil {
						errs <- fmt.Errorf("client %d, message %d of %d: %w", i, k, n, err)
						return
					}
					r.Buffer().Release()
				}
				if err := f.Wait(ctx); err != nil {
					errs <- fmt.Errorf("client %d, batch of %d: %w", i, n, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "shared receive queue %+v", rdma.SharedRecvStats(servers[0]))
		}
	}
	for range 8 {
		round(40, 24)
		round(64, 64)
	}
}

// Rule: the data mover the Batch godoc describes runs at the default
// options: 32 connections to one server, each looping on Batches of 64
// SENDs while the server reads. Their credits outnumber the server's
// shared receive queue twice over; it wedged in 2 runs of 2.
func TestBatchLoopsShareReceives(t *testing.T) {
	const conns, batch, rounds = 32, 64, 16
	opts := []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)}
	se, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, se.Close()) }()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ce.Close()) }()
	clients, accepted := enginePairs(t, ce, se, conns, opts...)
	servers := peers(t, clients, accepted)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*conns)
	for i, c := range clients {
		b, err := c.Alloc(64)
		require.NoError(t, err)
		defer b.Release()
		wg.Go(func() {
			bt := c.NewBatch()
			for r := range rounds {
				for range batch {
					bt.Send(b)
				}
				if err := bt.Post().Wait(ctx); err != nil {
					errs <- fmt.Errorf("client %d, round %d: %w", i, r, err)
					return
				}
			}
		})
		wg.Go(func() {
			for k := range rounds * batch {
				r := servers[i].Recv()
				if err := r.Wait(ctx); err != nil {
					errs <- fmt.Errorf("server %d, message %d: %w", i, k, err)
					return
				}
				r.Buffer().Release()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "shared receive queue %+v", rdma.SharedRecvStats(servers[0]))
	}
}

// Rule: a Batch that waits for room its own earlier messages hold goes
// out as soon as the application takes them, not at the shared receive
// queue's next decay look (a second or two). The client holds one credit
// of the Batch (given ahead), the server two of its messages unread: the
// Batch of the cap is passed over for room. The server takes the two;
// the second's credit used to wait for a batch of credits to fill
// (WithQueueDepth's receive depth 16: two), and the Batch for the decay
// look's recall, every run.
func TestBatchServedAsTaken(t *testing.T) { eachProvider(t, testBatchServedAsTaken) }

func testBatchServedAsTaken(t *testing.T, opts []rdma.Option) {
	const depth = 16
	opts = append(opts, rdma.WithQueueDepth(64, depth))
	se, err := rdma.OpenEngine(append(engineOpts(opts), rdma.WithSharedReceives(depth))...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, se.Close()) }()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ce.Close()) }()
	clients, accepted := enginePairs(t, ce, se, 1, opts...)
	c, s := clients[0], peers(t, clients, accepted)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	recv := func(n int) {
		t.Helper()
		for k := range n {
			r := s.Recv()
			require.NoError(t, r.Wait(ctx), "message %d of %d", k, n)
			r.Buffer().Release()
		}
	}
	// Each ask alone on the queue is given two credits (an eighth of
	// it): after three messages the client holds one.
	for i := range 3 {
		require.NoError(t, c.Send(b).Wait(ctx), "message %d", i)
	}
	recv(1)
	batch := c.NewBatch()
	for range depth {
		batch.Send(b)
	}
	f := batch.Post()
	// Its ask is passed over (waits) before the server takes the two.
	require.Eventually(t, func() bool { return rdma.SharedRecvStats(s).Waiting == 1 }, 10*time.Second, time.Millisecond,
		"the Batch's ask")
	recv(2)
	// Within a round trip or two; the decay look would take a second.
	bound, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- f.Wait(bound) }()
	recv(depth)
	require.NoError(t, <-done, "the Batch, %v after the messages before it were taken; shared receive queue %+v",
		500*time.Millisecond, rdma.SharedRecvStats(s))
}
