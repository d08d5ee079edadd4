package rc

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The sending half of the credits: a credit is the send queue's
// admission of a message (a receive the peer posted for it), so the
// send queue holds them, under postMu, and reads them with its room
// (roomLocked). The peer gives them in its credit WRITEs into this
// side's credit word, which this side reads when it is short (pullLocked),
// and in its answers to this side's asks (OnCredit); this side gives
// back what it does not use after an idle second (idleCredits) or when
// the peer recalls them (OnRecall). The receiving half, the credits this
// side gives its peer, is the grants' (Grants).

// sendCredits is the sending half of a connection's credits, in its send
// queue (SendQueue embeds it), under postMu but for the jobs' flags.
type sendCredits struct {
	credits    int         // messages we may send the peer
	creditSeen uint32      // the total of the peer's credit word last taken
	asked      bool        // an ask for credits is out
	askNow     bool        // postUnlock queues an ask
	backNow    bool        // postUnlock queues a return of unused credits
	idleArmed  bool        // idleTimer runs
	idleSeen   uint64      // posted at the idle timer's last look
	idleTimer  *time.Timer // gives unused credits back (idleCredits)

	creditBack atomic.Int64 // unused credits to give back (returnUnused)
	askQueued  atomic.Bool  // askJob is queued
	backQueued atomic.Bool  // backJob is queued
	askJob     func()       // q.askCredits, bound once: a method value allocates
	backJob    func()       // q.returnUnused
}

// maxCredits bounds the credits a peer can give, so adding never
// overflows.
const maxCredits = 1 << 30

// creditIdle is how long a sender keeps credits it does not use when no
// one recalls them. Shorter costs a sparse sender an ask per message:
// 100 ms cut 1,024 round-robin connections (BenchmarkAggregateRate) to
// a quarter of their rate.
const creditIdle = time.Second

// MaxAsk bounds a request for credits; the receiver caps it anyway.
const MaxAsk = 1 << 16

// UnlimitedCredits lets the connection send without credits: it has no
// control channel to get or return them (rdma_cm), and its peer's
// receives are unknown.
func (q *SendQueue) UnlimitedCredits() { q.credits = maxCredits }

// CreditCap is the most credits the peer gives at once: a chain that
// needs more could never go out. Connections without a control channel
// (rdma_cm) send without credits.
func (q *SendQueue) CreditCap() int {
	if !q.inBand {
		return maxCredits
	}
	return int(q.peer.RecvDepth)
}

// NeedCredits counts the WRs of wrs that take a receive at the peer.
func NeedCredits(wrs []verbs.SendWR) int {
	n := 0
	for i := range wrs {
		switch wrs[i].Opcode {
		case verbs.OpSend, verbs.OpSendWithImm, verbs.OpWriteWithImm:
			n++
		}
	}
	return n
}

// askCredits tells the peer how many credits the messages waiting need.
// It runs on the control worker. Credits given back before it looks
// (OnRecall, idleCredits) go in a frame ahead of the ask, even when
// their job is queued behind it: the peer takes a give-back as the end
// of the asks before it (SRQ.GiveBack), and an ask net of credits the
// peer then takes back would be passed over for room it has.
func (q *SendQueue) askCredits() {
	q.askQueued.Store(false)
	q.postMu.Lock()
	// The credit word may have what the messages waiting need by now.
	q.pullLocked()
	q.drainLocked()
	back := q.creditBack.Swap(0)
	want, need, chain, seen := -q.credits, 0, 0, q.creditSeen
	for i, qp := range q.pending.Items() {
		n := NeedCredits(qp.wrs)
		if i == 0 {
			need, chain = n-q.credits, n
		}
		if want += n; want >= MaxAsk {
			break
		}
	}
	if want <= 0 {
		q.asked = false
	}
	q.postUnlock()
	if back > 0 {
		q.owner.WriteControl(CtrlBack, binary.BigEndian.AppendUint32(nil, uint32(back)))
	}
	if want > 0 {
		p := binary.BigEndian.AppendUint32(nil, uint32(min(want, MaxAsk)))
		p = binary.BigEndian.AppendUint32(p, seen)
		p = binary.BigEndian.AppendUint32(p, uint32(max(1, need)))
		q.owner.WriteControl(CtrlAsk, binary.BigEndian.AppendUint32(p, uint32(max(1, chain))))
	}
}

// OnCredit answers this side's ask: total is what the peer has given
// over the connection's life (creditWord). It posts what waited.
func (q *SendQueue) OnCredit(total uint32) {
	q.postMu.Lock()
	q.takeTotalLocked(total)
	q.pullLocked()
	q.asked = false
	q.drainLocked()
	q.postUnlock()
}

// addCreditsLocked takes n credits from the peer, and starts the idle
// give-back. Caller holds postMu.
func (q *SendQueue) addCreditsLocked(n int) {
	q.credits = min(q.credits+n, maxCredits)
	if q.credits > 0 && !q.idleArmed && q.life.Err() == nil {
		q.idleArmed, q.idleSeen = true, q.posted
		if q.idleTimer == nil {
			q.idleTimer = time.AfterFunc(creditIdle, q.idleCredits)
		} else {
			q.idleTimer.Reset(creditIdle)
		}
	}
}

// idleCredits gives the peer back the credits of a connection that sent
// nothing since the last look. It runs on the idle timer.
func (q *SendQueue) idleCredits() {
	q.postMu.Lock()
	defer q.postUnlock()
	q.pullLocked()
	q.drainLocked()
	switch {
	case q.credits <= 0 || q.life.Err() != nil || q.life.Closing():
		q.idleArmed = false
	case q.posted == q.idleSeen && q.pending.Len() == 0:
		q.creditBack.Add(int64(q.credits))
		q.credits, q.idleArmed = 0, false
		q.backNow = true
	default:
		q.idleSeen = q.posted
		q.idleTimer.Reset(creditIdle)
	}
}

// returnUnused sends the credits idleCredits or OnRecall gave back,
// unless an ask took them ahead of itself (askCredits).
func (q *SendQueue) returnUnused() {
	q.backQueued.Store(false)
	if n := q.creditBack.Swap(0); n > 0 {
		q.owner.WriteControl(CtrlBack, binary.BigEndian.AppendUint32(nil, uint32(n)))
	}
}

// OnRecall serves the receiver's recall: others wait for credits. What
// this side holds and cannot use now goes back: all of it when no
// message waits, and when the first waiting chain needs more than it
// holds, which then asks again for the whole chain. So a chain never
// holds part of its credits while waiting for the rest. The give-back
// goes ahead of the ask, even one whose job was queued before it
// (askCredits).
func (q *SendQueue) OnRecall() {
	q.postMu.Lock()
	defer q.postUnlock()
	q.pullLocked()
	q.drainLocked()
	if q.credits <= 0 || q.life.Err() != nil {
		return
	}
	waiting := q.pending.Len() > 0
	if waiting && q.credits >= NeedCredits(q.pending.Items()[0].wrs) {
		return // it waits for room in the send queue, not for credits
	}
	q.creditBack.Add(int64(q.credits))
	q.credits = 0
	q.backNow = true
	if waiting {
		q.asked, q.askNow = true, true // after the give-back (askCredits)
	}
}

// takeTotalLocked takes the credits a total from the peer adds to what
// this side saw. Caller holds postMu.
func (q *SendQueue) takeTotalLocked(total uint32) {
	d := int32(total - q.creditSeen)
	if d <= 0 {
		return
	}
	q.creditSeen = total
	q.addCreditsLocked(int(d))
}

// pullLocked takes the credits the peer wrote into the credit word since
// the last look. Caller holds postMu.
func (q *SendQueue) pullLocked() {
	if q.cw != nil && q.cw.mr != nil {
		q.takeTotalLocked(atomic.LoadUint32(q.cw.word(creditWordIn)))
	}
}
