package rc

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLatencyBucket: a latency goes to the bucket whose bound is the
// first above it, the bounds exclusive, and past the last bound to the
// open bucket.
func TestLatencyBucket(t *testing.T) {
	assert.Equal(t, 0, LatencyBucket(-5), "a clock step back counts as zero")
	assert.Equal(t, 0, LatencyBucket(0))
	assert.Equal(t, 0, LatencyBucket(1023))
	assert.Equal(t, 1, LatencyBucket(1024))
	assert.Equal(t, 1, LatencyBucket(2047))
	assert.Equal(t, 2, LatencyBucket(2048))
	for i := range LatencyBuckets - 1 {
		b := int64(1) << (LatencyShift + i)
		assert.Equal(t, i, LatencyBucket(b-1), "below bound %d", i)
		assert.Equal(t, i+1, LatencyBucket(b), "at bound %d", i)
	}
	assert.Equal(t, LatencyBuckets-1, LatencyBucket(1<<62))

	var l Counters
	l.observe(1500)
	l.observe(1500)
	l.observe(-1)
	h := l.Load()
	assert.Equal(t, uint64(2), h.Latency[1])
	assert.Equal(t, uint64(1), h.Latency[0])
	assert.Equal(t, uint64(3000), h.LatencySum)
}

// TestLatencyCountingNoAllocs: counting a latency allocates nothing.
func TestLatencyCountingNoAllocs(t *testing.T) {
	var c Counters
	start := Nanotime()
	allocs := testing.AllocsPerRun(100, func() { c.observe(Nanotime() - start) })
	assert.Zero(t, allocs)
	var n uint64
	for _, b := range c.Load().Latency {
		n += b
	}
	assert.Equal(t, uint64(101), n)
}
