package rc

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Statuses is the number of completion statuses counted apart: those
// libibverbs names, up to GENERAL_ERR, under which a status beyond
// them is counted.
const Statuses = int(verbs.WCGeneralErr) + 1

// LatencyBuckets is the number of buckets of the latency histogram:
// bucket i counts latencies below 1<<(LatencyShift+i) ns and at least
// the bound of bucket i-1; the last has no bound.
const (
	LatencyBuckets = 24
	LatencyShift   = 10
)

// Counters are a connection's counters: what it issued, its send-side
// completions, its failed completions by status, and the latencies of
// its sampled operations. Each is atomic and counts on the connection's
// own cache lines, so counting costs an atomic add or two.
type Counters struct {
	sends, sendBytes, writes, writeBytes, reads, readBytes, atomics atomic.Uint64
	completions                                                     atomic.Uint64
	// Failed completions, by status, send-side and receive-side: the
	// totals are their sums, so a failure costs one atomic add.
	sendFail, recvFail [Statuses]atomic.Uint64
	latency            [LatencyBuckets]atomic.Uint64
	latencySum         atomic.Uint64 // nanoseconds
}

// CounterValues are Counters read, each atomically (the set is no
// snapshot).
type CounterValues struct {
	Sends, SendBytes, Writes, WriteBytes, Reads, ReadBytes, Atomics uint64
	Completions                                                     uint64
	SendFail, RecvFail                                              [Statuses]uint64
	Latency                                                         [LatencyBuckets]uint64
	LatencySum                                                      uint64 // nanoseconds
}

// Issued counts a work request the application issued: an operation
// of opc carrying n bytes.
func (s *Counters) Issued(opc verbs.Opcode, n int) {
	switch opc {
	case verbs.OpSend, verbs.OpSendWithImm:
		s.sends.Add(1)
		s.sendBytes.Add(uint64(n))
	case verbs.OpWrite, verbs.OpWriteWithImm:
		s.writes.Add(1)
		s.writeBytes.Add(uint64(n))
	case verbs.OpRead:
		s.reads.Add(1)
		s.readBytes.Add(uint64(n))
	case verbs.OpCompareSwap, verbs.OpFetchAdd:
		s.atomics.Add(1)
	}
}

// completed counts a send-side completion of status st that covers k
// WRs: the k-1 unsignaled ones before it succeeded. A flush of an
// orderly close is no failure.
func (s *Counters) completed(st verbs.WCStatus, k int, orderly bool) {
	if st == verbs.WCSuccess {
		s.completions.Add(uint64(max(k, 1)))
		return
	}
	if k > 1 {
		s.completions.Add(uint64(k - 1))
	}
	if st != verbs.WCWRFlushErr || !orderly {
		s.sendFail[statusIndex(st)].Add(1)
	}
}

// recvFailed counts a failed receive completion; a flush of an orderly
// close is no failure.
func (s *Counters) recvFailed(st verbs.WCStatus, orderly bool) {
	if st != verbs.WCWRFlushErr || !orderly {
		s.recvFail[statusIndex(st)].Add(1)
	}
}

// observe counts a latency of d nanoseconds.
func (s *Counters) observe(d int64) {
	d = max(d, 0)
	s.latency[LatencyBucket(d)].Add(1)
	s.latencySum.Add(uint64(d))
}

// Load reads the counters.
func (s *Counters) Load() CounterValues {
	v := CounterValues{
		Sends: s.sends.Load(), SendBytes: s.sendBytes.Load(),
		Writes: s.writes.Load(), WriteBytes: s.writeBytes.Load(),
		Reads: s.reads.Load(), ReadBytes: s.readBytes.Load(),
		Atomics: s.atomics.Load(), Completions: s.completions.Load(),
		LatencySum: s.latencySum.Load(),
	}
	for i := range s.sendFail {
		v.SendFail[i] = s.sendFail[i].Load()
		v.RecvFail[i] = s.recvFail[i].Load()
	}
	for i := range s.latency {
		v.Latency[i] = s.latency[i].Load()
	}
	return v
}

// statusIndex is st's index in the counters by status, a status beyond
// those named counted as GENERAL_ERR.
func statusIndex(st verbs.WCStatus) int { return int(min(st, verbs.WCGeneralErr)) }

// LatencyBucket is the bucket of a latency of d nanoseconds.
func LatencyBucket(d int64) int {
	return min(bits.Len64(uint64(max(d, 0))>>LatencyShift), LatencyBuckets-1)
}

// LatencySample is how often an operation's latency is measured: every
// LatencySample-th send-side operation a connection issues.
const LatencySample = 64

// Nanotime reads the monotonic clock, in nanoseconds since the process
// began plus one, so that a sampled op's start is never zero.
func Nanotime() int64 { return int64(time.Since(clockBase)) + 1 }

// clockBase is the origin of Nanotime.
var clockBase = time.Now()
