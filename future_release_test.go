package rdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/leak"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: with Future.Release, a loop of operations allocates nothing: a
// one-sided Write+Wait, and a Send answered by the peer's Recv whose
// Buffer and Future are released.
func TestFutureReleaseAllocatesNothing(t *testing.T) {
	if raceOn {
		t.Skip("the race detector makes sync.Pool drop futures at random")
	}
	if rdma.FuturesDebugged() {
		t.Skip("GORDMA_DEBUG=futures: released futures are never reused")
	}
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	region := reg2(t, ctx, s, c)
	src, err := c.Alloc(8)
	require.NoError(t, err)
	defer src.Release()

	const ops = 200
	writes := func() {
		for range ops {
			f := c.Write(src, region)
			if err := f.Wait(ctx); err != nil {
				panic(err)
			}
			f.Release()
		}
	}
	sendRecvs := func() {
		for range ops {
			r := s.Recv()
			f := c.Send(src)
			if err := f.Wait(ctx); err != nil {
				panic(err)
			}
			f.Release()
			if err := r.Wait(ctx); err != nil {
				panic(err)
			}
			if err := r.Buffer().Release(); err != nil {
				panic(err)
			}
			r.Release()
		}
	}
	// 64 Writes in flight: they coalesce into chains, where the
	// completion of one WR finishes the others before it (a finished op
	// escaped to the heap there, one allocation per covered WR).
	var window [64]*rdma.Future
	windowed := func() {
		for i := range ops + len(window) {
			slot := &window[i%len(window)]
			if *slot != nil {
				if err := (*slot).Wait(ctx); err != nil {
					panic(err)
				}
				(*slot).Release()
				*slot = nil
			}
			if i < ops {
				*slot = c.Write(src, region)
			}
		}
	}
	// Laps around the send queues first: the soft provider makes a
	// slot's inline space when the slot is first used.
	for range 4 {
		writes()
		sendRecvs()
		windowed()
	}
	write := testing.AllocsPerRun(5, writes)
	sendRecv := testing.AllocsPerRun(5, sendRecvs)
	window64 := testing.AllocsPerRun(5, windowed)
	t.Logf("allocations per %d operations: Write+Wait %.0f, Send+Recv %.0f, Writes 64 in flight %.0f", ops, write, sendRecv, window64)
	// The whole process counts: pollers that park and timers allocate
	// now and then, more on an emulated CPU; before Release every
	// operation allocated its Future.
	assert.Less(t, write, float64(ops/10), "Write+Wait")
	assert.Less(t, window64, float64(ops/10), "Writes 64 in flight")
	// The tests' leak check records where each received buffer was
	// taken (one allocation); a program's does not run.
	tracking := 0
	if leak.Enabled() {
		tracking = ops
	}
	assert.Less(t, sendRecv, float64(tracking+ops/10), "Send+Recv")
}

// Rule: Release leaves alone what it must not reuse: a future that is
// pending, one whose received Buffer is still held, and a Batch's.
func TestFutureReleaseRules(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	send := func(text string) {
		t.Helper()
		copy(b.Bytes(), text)
		f := c.Send(b)
		require.NoError(t, f.Wait(ctx))
		f.Release()
	}

	// Pending: still resolves with its message.
	pending := s.Recv()
	pending.Release()
	require.False(t, pending.Resolved())
	send("first")
	require.NoError(t, pending.Wait(ctx))
	held := pending.Buffer()
	require.NotNil(t, held)

	// Its Buffer held: not reused, so a later receive leaves it be.
	pending.Release()
	assert.True(t, pending.Resolved(), "a future whose buffer is held is not reset")
	for range 4 { // receives that release everything, reusing futures
		r := s.Recv()
		send("later")
		require.NoError(t, r.Wait(ctx))
		require.Equal(t, "later", string(r.Buffer().Bytes()[:5]))
		require.NoError(t, r.Buffer().Release())
		r.Release()
	}
	assert.Equal(t, "first", string(held.Bytes()[:5]), "the held buffer kept its message")
	assert.Same(t, held, pending.Buffer())
	require.NoError(t, held.Release())
	pending.Release()

	// A Batch's future is shared by its operations' records: kept.
	batch := c.NewBatch()
	batch.Send(b)
	bf := batch.Post()
	require.NoError(t, bf.Wait(ctx))
	bf.Release()
	assert.True(t, bf.Resolved(), "a Batch's future is not reset")
	r := s.Recv()
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, r.Buffer().Release())
	r.Release()
}

// Rule: a received message in a reused future is still caught by the
// safety net when the future is dropped with its buffer held.
func TestReusedFutureSafetyNet(t *testing.T) {
	if !leak.Enabled() {
		t.Skip("needs the tests' leak tracking")
	}
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	mark := leak.Now()
	collected := func() int {
		n := 0
		for _, l := range leak.Leaks() {
			if l.Collected {
				n++
			}
		}
		return n
	}
	reused := false
	for range 20 {
		r := s.Recv()
		f := c.Send(b)
		require.NoError(t, f.Wait(ctx))
		require.NoError(t, r.Wait(ctx))
		require.NoError(t, r.Buffer().Release())
		f.Release()
		r.Release()
		before := collected()
		got := loseReceived(t, ctx, c, s, b)
		reused = got == r || got == f
		gcUntilTrue(t, func() bool { return collected() > before }, "lost receive collected")
		if reused {
			break
		}
	}
	if !raceOn && !rdma.FuturesDebugged() {
		assert.True(t, reused, "a released future was reused by a later Recv")
	}
	// Lost on purpose: the run's final leak check must not count them.
	for _, l := range leak.Take(mark) {
		assert.True(t, l.Collected, "leak at %s not reported by the safety net", l.Site)
	}
}

// loseReceived receives a message and drops its future and buffer
// without Release. It returns the future, for its address only.
//
//go:noinline
func loseReceived(t *testing.T, ctx context.Context, c, s *rdma.Conn, b *rdma.Buffer) *rdma.Future {
	r := s.Recv()
	f := c.Send(b)
	require.NoError(t, f.Wait(ctx))
	require.NoError(t, r.Wait(ctx))
	require.NotNil(t, r.Buffer())
	return r
}
