package rc

import (
	"slices"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Coalescing. A goroutine that issues operations one by one, each a
// Future, rings one doorbell per operation (on rxe a system call per
// WR), where a C peer posts lists of them; operations combine into one
// chain only when goroutines contend for postMu. So while the send
// queue has coalesceAfter WRs or more posted and not completed, an
// operation of up to coalesceMax bytes issued with nothing queued does
// not ring: it starts a coalescing chain in pending, and the operations
// issued next join it (an inline one with its bytes copied into the
// chain's stage, since its caller may change them at once). The chain
// goes out, as one chain with one WR in signalEvery signaled, with the
// first operation that finds it full (coalesceChain WRs), or finds that a
// completion came since it began, or cannot join it (a Batch, an
// atomic, a big one): so it grows at the rate completions come, and the
// issuing goroutine posts it, as it would have posted each. Should no
// operation come, the completion that leaves fewer than coalesceAfter in
// flight posts it (drainWithLocked): none waits longer than the WRs
// ahead of it on a send queue that completes in order. A lone
// operation, and a ping-pong's few in flight, go out at their call.

// coalesceAfter is how many WRs posted and not completed make an
// operation wait to go out in a chain; coalesceMax is the most bytes
// one may move: a bigger one costs more than its doorbell, which it
// keeps (on soft, 64 KiB operations that waited measured up to 17 %
// slower in one process, and level between two). coalesceChain is the
// longest chain, perftest's post list: on rxe, where a doorbell is a
// system call, one goroutine's 2 B WRITEs through Futures measured
// 1.41× the message rate of chains of 16 (test/perf/compare.sh -r 5 -m
// 12800 -T write_mr -B f91dc75; docs/performance.md).
const (
	coalesceAfter = 8
	coalesceMax   = 4096
	coalesceChain = 64
)

// coalesceLocked puts the one-WR chain wrs (ops) in the coalescing
// chain, which it starts when nothing is queued, and reports whether it
// did. Starting one needs room and credits for wrs (the caller found
// them), joining one room and credits for the chain with wrs. An
// inline operation's bytes go to the chain's stage, taken from the pool
// with the first: without one it goes out at once. Atomics
// and operations of more than coalesceMax bytes do not coalesce.
// Caller holds postMu.
func (q *SendQueue) coalesceLocked(wrs []verbs.SendWR, ops []Op) bool {
	if len(wrs) != 1 || len(wrs[0].SGL) > 1 || ops[0].Kind == OpAtomic || q.depth-q.sqFree < coalesceAfter ||
		len(wrs[0].SGL) == 1 && wrs[0].SGL[0].Length > coalesceMax {
		return false
	}
	inline := wrs[0].Flags&verbs.SendInline != 0 && len(wrs[0].SGL) == 1
	if inline && (int(wrs[0].SGL[0].Length) > q.inline || ops[0].Buf == nil) {
		return false
	}
	var c *queuedPost
	switch q.pending.Len() {
	case 0:
		c = queuedPool.Get().(*queuedPost)
		c.coal, c.at = true, q.completed.Load()
		c.wrs, c.ops = c.wrs[:0], c.ops[:0]
		c.sges = slices.Grow(c.sges[:0], coalesceChain) // never grows again: the WRs point into it
	case 1:
		// It joins while the chain can go with it (room, credits), so
		// a chain never waits for room, nor for credits, where its
		// operations would have gone out one by one.
		c = q.pending.Items()[0]
		if !c.coal || len(c.wrs) == coalesceChain || q.completed.Load() != c.at ||
			!q.roomAfterLocked(wrs, len(c.wrs), NeedCredits(c.wrs)) {
			return false
		}
	default:
		return false
	}
	i, o := len(c.wrs), &ops[0]
	if inline && c.stage == nil {
		stage, err := o.Buf.Pool().Get(coalesceChain * q.inline)
		if err != nil {
			if i == 0 {
				c.free()
			}
			return false
		}
		c.stage = stage
	}
	if i == 0 {
		q.queuedSeq++
		c.seq = q.queuedSeq
		q.pending.Push(c)
	}
	c.wrs = append(c.wrs, wrs[0])
	c.ops = append(c.ops, *o) // o keeps its hold on its buffer, as a posted op does
	if len(wrs[0].SGL) == 1 {
		sge := wrs[0].SGL[0]
		if inline {
			n := int(sge.Length)
			copy(c.stage.Held(i*q.inline, n), o.bytesAt(sge))
			sge = verbs.SGE{Addr: c.stage.Addr() + uint64(i*q.inline), Length: uint32(n), LKey: c.stage.LKey()}
		}
		c.sges = append(c.sges, sge)
		c.wrs[i].SGL = c.sges[len(c.sges)-1:]
	}
	q.pendingWRs++
	q.stampLatency(c.ops[i:])
	return true
}

// flushCoalescedLocked posts the coalescing chain, if one waits and
// fits: a fence, a close and a combined chain go behind it, now. Caller
// holds postMu.
func (q *SendQueue) flushCoalescedLocked() {
	if q.pending.Len() > 0 && q.pending.Items()[0].coal {
		_, _ = q.drainWithLocked(nil, nil, true)
	}
}
