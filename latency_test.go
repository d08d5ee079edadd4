package rdma_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// TestLatencySampled: every LatencySample-th operation a connection
// issues is measured, each of a Batch counted, so N operations give N/64
// latencies exactly; the histogram's quantiles are ordered and inside the
// time the operations took, and the engine's totals carry it, after the
// connection closed too.
func TestLatencySampled(t *testing.T) { eachProvider(t, testLatencySampled) }

func testLatencySampled(t *testing.T, opts []rdma.Option) {
	se, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer ce.Close()
	ln, err := se.Listen("rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, s := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
		return ce.Dial(ctx, "rdma", address)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	region := reg2(t, ctx, s, c)
	src, err := c.Alloc(64)
	require.NoError(t, err)
	defer src.Release()

	const writes = 20*rdma.LatencySample + 10 // the 10 make no sample
	start := time.Now()
	for i := range writes {
		require.NoError(t, c.Write(src, region).Wait(ctx), "write %d", i)
	}
	// A Batch's operations count one by one: 54 more make 21 samples.
	b := c.NewBatch()
	for range rdma.LatencySample - 10 {
		b.Write(src, region)
	}
	require.NoError(t, b.Post().Wait(ctx))
	took := time.Since(start)

	h := c.Stats().Latency
	assert.Equal(t, uint64(21), h.Count(), "one operation in %d", rdma.LatencySample)
	assert.Positive(t, h.Sum)
	assert.LessOrEqual(t, h.Sum, took, "the sampled latencies are within the time all took")
	q50, q90, q99 := h.Quantile(0.5), h.Quantile(0.9), h.Quantile(0.99)
	t.Logf("%d samples: p50 %v p90 %v p99 %v, mean %v; %v per write", h.Count(), q50, q90, q99, h.Sum/time.Duration(h.Count()), took/writes)
	assert.Positive(t, q50)
	assert.LessOrEqual(t, q50, q90)
	assert.LessOrEqual(t, q90, q99)
	assert.LessOrEqual(t, q99, h.Quantile(1))
	assert.Zero(t, s.Stats().Latency.Count(), "the target issued nothing")

	assert.Equal(t, h, ce.Stats().Total.Latency, "the engine sums its connections")
	require.NoError(t, c.Close())
	es := ce.Stats()
	assert.Zero(t, es.Total.Latency.Count())
	assert.Equal(t, h, es.Closed.Latency, "a closed connection's latencies stay counted")
}

// TestLatencyQuantile: quantiles interpolate inside a bucket, the last,
// open bucket gives its lower bound, and an empty histogram gives zero.
func TestLatencyQuantile(t *testing.T) {
	var h rdma.LatencyHistogram
	assert.Zero(t, h.Quantile(0.5))
	assert.Zero(t, h.Count())

	// 100 latencies in [2.048 µs, 4.096 µs): bucket 2.
	h.Buckets[2] = 100
	assert.Equal(t, 2048*time.Nanosecond, h.Quantile(0))
	assert.Equal(t, 3072*time.Nanosecond, h.Quantile(0.5))
	assert.Equal(t, 4096*time.Nanosecond, h.Quantile(1))
	assert.Equal(t, 2048*time.Nanosecond, h.Quantile(-1), "q is clamped to [0, 1]")

	// 100 more in the open bucket: the upper half of the quantiles is
	// its lower bound, 4.29 s.
	h.Buckets[rdma.LatencyBuckets-1] = 100
	assert.Equal(t, uint64(200), h.Count())
	assert.Equal(t, 4096*time.Nanosecond, h.Quantile(0.5))
	assert.Equal(t, rdma.LatencyBound(rdma.LatencyBuckets-2), h.Quantile(0.99))
	assert.Equal(t, rdma.LatencyBound(rdma.LatencyBuckets-2), h.Quantile(1))

	prev := time.Duration(0)
	for i := range rdma.LatencyBuckets - 1 {
		b := rdma.LatencyBound(i)
		assert.Equal(t, 1024*time.Nanosecond<<i, b, "bound %d", i)
		assert.Greater(t, b, prev)
		prev = b
	}
	assert.InDelta(t, 4.29, rdma.LatencyBound(rdma.LatencyBuckets-2).Seconds(), 0.01)
	assert.Equal(t, time.Duration(math.MaxInt64), rdma.LatencyBound(rdma.LatencyBuckets-1))
}

// TestLatencySamplingAllocs: sampling allocates nothing. A run of
// LatencySample Write+Waits, one of them sampled, allocates what the same
// run allocated before the histogram (5b62150, soft): 67 per 64, the
// Future of each and 3 more. Under the race detector sync.Pool drops
// pooled objects at random, so there the count is only logged (the
// sampling itself is TestLatencySamplingNoAllocs's).
func TestLatencySamplingAllocs(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	region := reg2(t, ctx, s, c)
	src, err := c.Alloc(8)
	require.NoError(t, err)
	defer src.Release()
	const runs = 20
	before := c.Stats().Latency.Count()
	allocs := testing.AllocsPerRun(runs, func() {
		for range rdma.LatencySample {
			if err := c.Write(src, region).Wait(ctx); err != nil {
				panic(err)
			}
		}
	})
	t.Logf("%.0f allocations per %d Write+Waits (race detector: %v)", allocs, rdma.LatencySample, raceOn)
	assert.Equal(t, uint64(runs+1), c.Stats().Latency.Count()-before, "one sample per run (and the warm-up run)")
	if !raceOn {
		// AllocsPerRun counts the whole process: pollers that park and
		// timers allocate now and then, more often on a slow (emulated)
		// CPU, so a few over the budget are not the sampling's.
		assert.LessOrEqual(t, allocs, float64(writeWaitAllocs+writeWaitSlack), "allocations per %d Write+Waits", rdma.LatencySample)
	}
}

// writeWaitAllocs is what LatencySample Write+Waits allocated before the
// latency histogram (5b62150, soft, without the race detector).
const writeWaitAllocs = 67

// writeWaitSlack is what background goroutines may add to a run.
const writeWaitSlack = 8
