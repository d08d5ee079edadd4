package rdma

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
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

// TestOpRecordSize: the start time of a sampled op costs the op table no
// memory: an op still fits 56 bytes and a slot 64 (on 64-bit).
func TestOpRecordSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes of a 64-bit build")
	}
	assert.Equal(t, uintptr(56), unsafe.Sizeof(op{}))
	assert.Equal(t, uintptr(64), unsafe.Sizeof(slot{}))
}

// TestLatencySampleEvery: stampLatency marks exactly every
// LatencySample-th op, across calls and batches.
func TestLatencySampleEvery(t *testing.T) {
	var c conn
	ops := make([]op, 3*LatencySample+5)
	for i := 0; i < len(ops); i += 7 {
		c.stampLatency(ops[i:min(i+7, len(ops))])
	}
	for i := range ops {
		assert.Equal(t, (i+1)%LatencySample == 0, ops[i].start != 0, "op %d", i)
	}
}

// TestLatencySamplingNoAllocs: stamping ops and counting their latency
// allocate nothing, sampled or not.
func TestLatencySamplingNoAllocs(t *testing.T) {
	var c conn
	ops := make([]op, LatencySample)
	allocs := testing.AllocsPerRun(100, func() {
		for i := range ops {
			ops[i].start = 0
			c.stampLatency(ops[i : i+1])
			c.observeLatency(&ops[i])
		}
	})
	assert.Zero(t, allocs)
	assert.Equal(t, uint64(101), c.st.latency.load().Count(), "one sample per run of LatencySample")
}
