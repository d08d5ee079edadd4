package rc

import "time"

// LatencySample is how often an operation's latency is measured: every
// LatencySample-th send-side operation a connection issues.
const LatencySample = 64

// Nanotime reads the monotonic clock, in nanoseconds since the process
// began plus one, so that a sampled op's start is never zero.
func Nanotime() int64 { return int64(time.Since(clockBase)) + 1 }

// clockBase is the origin of Nanotime.
var clockBase = time.Now()

// stampLatency marks every LatencySample-th op the connection submits
// with its start time (Op.Start); the others cost the counter check.
// Caller holds postMu.
func (q *SendQueue) stampLatency(ops []Op) {
	for i := range ops {
		q.latencySeq++
		if q.latencySeq%LatencySample == 0 {
			ops[i].Start = Nanotime()
		}
	}
}
