package rdma

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/go-rdma/rdma/internal/rc"
)

// TestLatencyBucket: a latency goes to the bucket whose bound is the
// first above it, the bounds exclusive, and past the last bound to the
// open bucket.
func TestLatencyBucket(t *testing.T) {
	assert.Equal(t, 0, latencyBucket(-5), "a clock step back counts as zero")
	assert.Equal(t, 0, latencyBucket(0))
	assert.Equal(t, 0, latencyBucket(1023))
	assert.Equal(t, 1, latencyBucket(1024))
	assert.Equal(t, 1, latencyBucket(2047))
	assert.Equal(t, 2, latencyBucket(2048))
	for i := range LatencyBuckets - 1 {
		b := int64(LatencyBound(i))
		assert.Equal(t, i, latencyBucket(b-1), "below bound %d", i)
		assert.Equal(t, i+1, latencyBucket(b), "at bound %d", i)
	}
	assert.Equal(t, LatencyBuckets-1, latencyBucket(1<<62))

	var l latencyCounters
	l.observe(1500)
	l.observe(1500)
	l.observe(-1)
	h := l.load()
	assert.Equal(t, uint64(2), h.Buckets[1])
	assert.Equal(t, uint64(1), h.Buckets[0])
	assert.Equal(t, uint64(3000), uint64(h.Sum))
}

// TestLatencySamplingNoAllocs: counting the latency of ops allocates
// nothing, sampled or not.
func TestLatencySamplingNoAllocs(t *testing.T) {
	var c conn
	ops := make([]rc.Op, LatencySample)
	allocs := testing.AllocsPerRun(100, func() {
		for i := range ops {
			ops[i].Start = 0
			if i == 0 {
				ops[i].Start = rc.Nanotime() // sampled
			}
			c.observeLatency(&ops[i])
		}
	})
	assert.Zero(t, allocs)
	assert.Equal(t, uint64(101), c.st.latency.load().Count(), "one sample per run of LatencySample")
}
