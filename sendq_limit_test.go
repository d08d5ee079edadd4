package rdma_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: a connection holds at most its send queue limit of operations
// issued and not completed; past it a post fails at once with
// ErrQueueFull, naming the conn and the limit, and drops its reference
// to the buffer. 200,000 Sends to a peer that never reads once left
// 199,984 pending and about 100 MB more heap.
func TestSendQueueLimit(t *testing.T) { eachProvider(t, testSendQueueLimit) }

func testSendQueueLimit(t *testing.T, opts []rdma.Option) {
	const limit = 4096 // the default at the default send depth of 128
	// Five times the limit shows the bound as well as 200,000 did, at a
	// tenth of the cost (35 s on rxe under TCG).
	n := 5 * limit
	c, s := rdmatest.Pair(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	inUse := c.PoolStats().BuffersInUse

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var pending []*rdma.Future
	full, ok := 0, 0
	var fullErr error
	for i := range n {
		f := c.Send(b)
		if !f.Resolved() {
			pending = append(pending, f)
			continue
		}
		if f.Err() == nil {
			ok++
			continue
		}
		require.ErrorIs(t, f.Err(), rdma.ErrQueueFull, "send %d", i)
		full++
		fullErr = f.Err()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// Those in flight when issued may have completed since.
	waiting := 0
	for _, f := range pending {
		if !f.Resolved() {
			waiting++
		}
	}
	t.Logf("%d sends: %d pending, %d done, %d refused; heap %+d KiB", n, waiting, n-full-waiting, full, (int64(after.HeapAlloc)-int64(before.HeapAlloc))>>10)
	require.LessOrEqual(t, waiting, limit, "operations pending past the limit")
	require.GreaterOrEqual(t, full, n-limit-128, "posts past the limit must fail at once")
	require.Error(t, fullErr)
	assert.Contains(t, fullErr.Error(), fmt.Sprint(limit))
	assert.Contains(t, fullErr.Error(), c.RemoteAddr().String(), "the error names the conn")
	assert.Less(t, int64(after.HeapAlloc)-int64(before.HeapAlloc), int64(16<<20), "heap growth")

	// Nothing queued is lost: the peer reads, and every pending send
	// goes out; the queue takes posts again.
	for i := range ok + len(pending) {
		r := s.Recv()
		require.NoError(t, r.Wait(ctx), "message %d", i)
		require.NoError(t, r.Buffer().Release())
	}
	for i, f := range pending {
		require.NoError(t, f.Wait(ctx), "pending send %d", i)
	}
	require.NoError(t, c.Send(b).Wait(ctx), "a send after the queue drained")
	r := s.Recv()
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, r.Buffer().Release())
	assert.Equal(t, inUse, c.PoolStats().BuffersInUse, "pool accounting")
}

// Rule: a batch that does not fit the room left under the limit fails
// whole, at once, with ErrQueueFull; pending operations fail with
// ErrClosed at Close and the pool balances.
func TestSendQueueLimitBatch(t *testing.T) {
	const limit = 64
	c, _ := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithQueueDepth(32, 8), rdma.WithSendQueueLimit(limit))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	inUse := c.PoolStats().BuffersInUse
	// The peer never reads: its receive depth of 8 go out with the
	// credits and the rest wait. The 8 hold room under the limit until
	// they complete, which on a slow machine is after the first fill, so
	// they are waited for and the queue filled again: then nothing can
	// complete before the Batch.
	var pending []*rdma.Future
	fill := func() {
		for range limit + 8 {
			f := c.Send(b)
			if f.Resolved() && f.Err() != nil {
				require.ErrorIs(t, f.Err(), rdma.ErrQueueFull)
				continue
			}
			pending = append(pending, f)
		}
	}
	fill()
	for _, f := range pending[:8] {
		require.NoError(t, f.Wait(ctx))
	}
	fill()
	batch := c.NewBatch()
	for range 8 {
		batch.Send(b)
	}
	f := batch.Post()
	require.True(t, f.Resolved(), "a batch past the limit must fail at once")
	require.ErrorIs(t, f.Err(), rdma.ErrQueueFull)
	require.NoError(t, c.Close())
	for _, f := range pending {
		if err := f.Wait(ctx); err != nil {
			require.ErrorIs(t, err, rdma.ErrClosed)
		}
	}
	assert.Equal(t, inUse, c.PoolStats().BuffersInUse, "pool accounting")
}

// Rule: WithSendQueueLimit takes a limit of at least the send depth (a
// batch of the send depth must fit).
func TestSendQueueLimitOption(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := rdma.Dial(ctx, "rdma", "127.0.0.1:1", rdma.WithProvider(rdma.ProviderSoft), rdma.WithSendQueueLimit(0))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	_, err = rdma.Dial(ctx, "rdma", "127.0.0.1:1", rdma.WithProvider(rdma.ProviderSoft), rdma.WithQueueDepth(128, 16), rdma.WithSendQueueLimit(64))
	require.ErrorIs(t, err, rdma.ErrInvalid)
}

// Rule: ConnStats.QueueFull counts each post refused with ErrQueueFull,
// a refused Batch once, and nothing else; the engine's totals carry it.
func TestQueueFullCounted(t *testing.T) {
	const limit = 64
	opts := []rdma.Option{rdma.WithProvider(rdma.ProviderSoft), rdma.WithQueueDepth(32, 8), rdma.WithSendQueueLimit(limit)}
	se, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer ce.Close()
	ln, err := se.Listen("rdma", "127.0.0.1:0", listenOpts(opts)...)
	require.NoError(t, err)
	defer ln.Close()
	c, _ := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
		return ce.Dial(ctx, "rdma", address, connOpts(opts)...)
	})
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	require.Zero(t, c.Stats().QueueFull)

	// The peer never reads: its receive depth of 8 go out with the
	// credits, limit wait, and the rest are refused. The 8 may complete
	// after the first fill (a slow machine), freeing room, so they are
	// waited for and the queue filled again: then nothing can complete
	// before the Batch.
	refused := 0
	var accepted []*rdma.Future
	fill := func() {
		for range 2*limit + 8 {
			f := c.Send(b)
			if f.Resolved() && f.Err() != nil {
				require.ErrorIs(t, f.Err(), rdma.ErrQueueFull)
				refused++
				continue
			}
			accepted = append(accepted, f)
		}
	}
	fill()
	require.Positive(t, refused)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, f := range accepted[:8] {
		require.NoError(t, f.Wait(ctx))
	}
	fill()
	assert.Equal(t, uint64(refused), c.Stats().QueueFull)

	batch := c.NewBatch()
	for range 4 {
		batch.Send(b)
	}
	require.ErrorIs(t, batch.Post().Err(), rdma.ErrQueueFull)
	assert.Equal(t, uint64(refused+1), c.Stats().QueueFull, "a refused Batch counts once")
	assert.Equal(t, uint64(refused+1), ce.Stats().Total.QueueFull)
	assert.Zero(t, se.Stats().Total.QueueFull, "the peer refused nothing")
	require.NoError(t, c.Close())
	assert.Equal(t, uint64(refused+1), ce.Stats().Closed.QueueFull)
}
