package rdma

import (
	"math"
	"time"

	"github.com/go-rdma/rdma/internal/rc"
)

// LatencySample is how often an operation's latency is measured: every
// LatencySample-th send-side operation a connection issues (SEND,
// SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ, an atomic; each of a
// Batch), counted per connection. Only those read the clock, so the
// histogram costs the others a counter check.
const LatencySample = rc.LatencySample

// LatencyBuckets is the number of buckets of a LatencyHistogram.
const LatencyBuckets = rc.LatencyBuckets

// latencyShift makes the bound of bucket 0: 1<<latencyShift ns, 1.024 µs.
const latencyShift = rc.LatencyShift

// LatencyHistogram counts the latencies of sampled operations (see
// LatencySample): from the call that issued the operation to its
// completion, waits for credits and for room in the send queue included.
// Operations that failed are not counted: their completion says little
// of the path's latency (see ConnStats.SendFailures).
//
// Bucket i counts the latencies below LatencyBound(i) and at least
// LatencyBound(i-1): bucket 0 those below 1.024 µs, each next bound
// twice the one before, up to 4.29 s; the last bucket has no bound.
type LatencyHistogram struct {
	Buckets [LatencyBuckets]uint64
	// Sum is the total of the latencies counted, exact.
	Sum time.Duration
}

// LatencyBound is the upper bound (exclusive) of bucket i of a
// LatencyHistogram, 1.024 µs·2^i; the last bucket's is math.MaxInt64.
func LatencyBound(i int) time.Duration {
	if i >= LatencyBuckets-1 {
		return math.MaxInt64
	}
	return time.Duration(1) << (latencyShift + i)
}

// Count is the number of latencies counted.
func (h LatencyHistogram) Count() uint64 {
	var n uint64
	for _, b := range h.Buckets {
		n += b
	}
	return n
}

// Quantile estimates the latency below which a fraction q (0 to 1) of
// those counted fall, interpolating linearly inside the bucket it falls
// in; in the last bucket it is the bucket's lower bound, 4.29 s. It is
// zero for an empty histogram, and grows with q.
func (h LatencyHistogram) Quantile(q float64) time.Duration {
	n := h.Count()
	if n == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := q * float64(n)
	var cum float64
	for i, b := range h.Buckets {
		if b == 0 || cum+float64(b) < rank {
			cum += float64(b)
			continue
		}
		lo := time.Duration(0)
		if i > 0 {
			lo = LatencyBound(i - 1)
		}
		if i == LatencyBuckets-1 {
			return lo
		}
		hi := LatencyBound(i)
		return lo + time.Duration(float64(hi-lo)*(rank-cum)/float64(b))
	}
	return LatencyBound(LatencyBuckets - 2) // not reached: rank <= n
}

func (h *LatencyHistogram) add(o LatencyHistogram) {
	for i := range h.Buckets {
		h.Buckets[i] += o.Buckets[i]
	}
	h.Sum += o.Sum
}
