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
// inline operation (at most the inline size) issued with nothing queued
// does not ring: it starts a coalescing chain in pending, with its bytes
// copied into the chain's stage, and the inline operations issued next
// join it. The chain goes out, as one chain with one WR in signalEvery
// signaled, with the first operation that finds it full (signalEvery
// WRs), or finds that a completion came since it began, or cannot join
// it: so it grows at the rate completions come, and the issuing
// goroutine posts it, as it would have posted each. Should no operation
// come, the completion that leaves fewer than coalesceAfter in flight
// posts it (drainWithLocked): none waits longer than the WRs ahead of it
// on a send queue that completes in order. A lone operation, and a
// ping-pong's few in flight, go out at their call.

// coalesceAfter is how many WRs posted and not completed make an inline
// operation wait to go out in a chain.
const coalesceAfter = 8

// coalesceLocked puts the one-WR chain wrs (ops) in the coalescing
// chain, which it starts when nothing is queued, and reports whether it
// did. Starting one needs room and credits for wrs (the caller found
// them), and a stage from the pool: without one the operation goes out
// at once. Caller holds postMu.
func (q *SendQueue) coalesceLocked(wrs []verbs.SendWR, ops []Op) bool {
	if len(wrs) != 1 || wrs[0].Flags&verbs.SendInline == 0 || len(wrs[0].SGL) != 1 ||
		int(wrs[0].SGL[0].Length) > q.inline || ops[0].Buf == nil || q.depth-q.sqFree < coalesceAfter {
		return false
	}
	var c *queuedPost
	switch q.pending.Len() {
	case 0:
		stage, err := ops[0].Buf.Pool().Get(signalEvery * q.inline)
		if err != nil {
			return false
		}
		c = queuedPool.Get().(*queuedPost)
		c.coal, c.at, c.stage = true, q.completed.Load(), stage
		c.wrs, c.ops = c.wrs[:0], c.ops[:0]
		c.sges = slices.Grow(c.sges[:0], signalEvery) // never grows again: the WRs point into it
		q.queuedSeq++
		c.seq = q.queuedSeq
		q.pending.Push(c)
	case 1:
		c = q.pending.Items()[0]
		if !c.coal || len(c.wrs) == signalEvery || q.completed.Load() != c.at {
			return false
		}
	default:
		return false
	}
	i, sge, o := len(c.wrs), wrs[0].SGL[0], &ops[0]
	n := int(sge.Length)
	copy(c.stage.Held(i*q.inline, n), o.Buf.Held(int(sge.Addr-o.Buf.Addr()), n))
	c.sges = append(c.sges, verbs.SGE{Addr: c.stage.Addr() + uint64(i*q.inline), Length: uint32(n), LKey: c.stage.LKey()})
	c.wrs = append(c.wrs, wrs[0])
	c.wrs[i].SGL = c.sges[i : i+1]
	c.ops = append(c.ops, *o) // o keeps its hold on the caller's buffer, as a posted op does
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
