package rdma

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The sending half of the credits: a credit is the send queue's
// admission of a message (a receive the peer posted for it), so the
// send queue holds them, under postMu, and reads them with its room
// (roomLocked). The peer gives them in its credit WRITEs into this
// side's credit word, which this side reads when it is short (pullLocked),
// and in its answers to this side's asks (onCredit); this side gives
// back what it does not use after an idle second (idleCredits) or when
// the peer recalls them (onRecall). The receiving half, the credits this
// side gives its peer, is the grants' (creditState).

// sendCredits is the sending half of a connection's credits, in its send
// queue (sendQueue embeds it), under postMu but for the jobs' flags.
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
	askJob     func()       // c.askCredits, bound once: a method value allocates
	backJob    func()       // c.returnUnused
}

// maxCredits bounds the credits a peer can give, so adding never
// overflows.
const maxCredits = 1 << 30

// creditIdle is how long a sender keeps credits it does not use when no
// one recalls them. Shorter costs a sparse sender an ask per message:
// 100 ms cut 1,024 round-robin connections (BenchmarkAggregateRate) to
// a quarter of their rate.
const creditIdle = time.Second

// maxAsk bounds a request for credits; the receiver caps it anyway.
const maxAsk = 1 << 16

// unlimitedCredits lets the connection send without credits: it has no
// control channel to get or return them (rdma_cm), and its peer's
// receives are unknown.
func (q *sendQueue) unlimitedCredits() { q.credits = maxCredits }

// creditCap is the most credits the peer gives at once: a chain that
// needs more could never go out. Connections without a control channel
// (rdma_cm) send without credits.
func (c *conn) creditCap() int {
	if c.ctl.ctrl == nil {
		return maxCredits
	}
	return int(c.peer.RecvDepth)
}

// needCredits counts the WRs of wrs that take a receive at the peer.
func needCredits(wrs []verbs.SendWR) int {
	n := 0
	for i := range wrs {
		switch wrs[i].Opcode {
		case verbs.OpSend, verbs.OpSendWithImm, verbs.OpWriteWithImm:
			n++
		}
	}
	return n
}

// roomLocked reports whether wrs fit the send queue and the credits,
// and asks the peer for credits when they are what is short. Caller
// holds postMu.
func (c *conn) roomLocked(wrs []verbs.SendWR) bool {
	if c.sq.sqFree < len(wrs) || c.sq.held {
		return false
	}
	need := needCredits(wrs)
	if c.sq.credits >= need {
		return true
	}
	if c.pullLocked(); c.sq.credits >= need {
		return true
	}
	if !c.sq.asked && c.ctl.ctrl != nil {
		c.sq.asked, c.sq.askNow = true, true // postUnlock queues the ask
	}
	return false
}

// askCredits tells the peer how many credits the messages waiting need.
// It runs on the control worker. Credits given back before it looks
// (onRecall, idleCredits) go in a frame ahead of the ask, even when
// their job is queued behind it: the peer takes a give-back as the end
// of the asks before it (SRQ.GiveBack), and an ask net of credits the
// peer then takes back would be passed over for room it has.
func (c *conn) askCredits() {
	c.sq.askQueued.Store(false)
	c.sq.postMu.Lock()
	// The credit word may have what the messages waiting need by now.
	c.pullLocked()
	c.drainLocked()
	back := c.sq.creditBack.Swap(0)
	want, need, chain, seen := -c.sq.credits, 0, 0, c.sq.creditSeen
	for i, q := range c.sq.pending.Items() {
		n := needCredits(q.wrs)
		if i == 0 {
			need, chain = n-c.sq.credits, n
		}
		if want += n; want >= maxAsk {
			break
		}
	}
	if want <= 0 {
		c.sq.asked = false
	}
	c.postUnlock()
	if back > 0 {
		c.writeControl(rc.CtrlBack, binary.BigEndian.AppendUint32(nil, uint32(back)))
	}
	if want > 0 {
		p := binary.BigEndian.AppendUint32(nil, uint32(min(want, maxAsk)))
		p = binary.BigEndian.AppendUint32(p, seen)
		p = binary.BigEndian.AppendUint32(p, uint32(max(1, need)))
		c.writeControl(rc.CtrlAsk, binary.BigEndian.AppendUint32(p, uint32(max(1, chain))))
	}
}

// onCredit answers this side's ask: total is what the peer has given
// over the connection's life (creditWord). It posts what waited.
func (c *conn) onCredit(total uint32) {
	c.sq.postMu.Lock()
	c.takeTotalLocked(total)
	c.pullLocked()
	c.sq.asked = false
	c.drainLocked()
	c.postUnlock()
}

// addCreditsLocked takes n credits from the peer, and starts the idle
// give-back. Caller holds postMu.
func (c *conn) addCreditsLocked(n int) {
	c.sq.credits = min(c.sq.credits+n, maxCredits)
	if c.sq.credits > 0 && !c.sq.idleArmed && c.life.Err() == nil {
		c.sq.idleArmed, c.sq.idleSeen = true, c.sq.posted
		if c.sq.idleTimer == nil {
			c.sq.idleTimer = time.AfterFunc(creditIdle, c.idleCredits)
		} else {
			c.sq.idleTimer.Reset(creditIdle)
		}
	}
}

// idleCredits gives the peer back the credits of a connection that sent
// nothing since the last look. It runs on the idle timer.
func (c *conn) idleCredits() {
	c.sq.postMu.Lock()
	defer c.postUnlock()
	c.pullLocked()
	c.drainLocked()
	switch {
	case c.sq.credits <= 0 || c.life.Err() != nil || c.life.Closing():
		c.sq.idleArmed = false
	case c.sq.posted == c.sq.idleSeen && c.sq.pending.Len() == 0:
		c.sq.creditBack.Add(int64(c.sq.credits))
		c.sq.credits, c.sq.idleArmed = 0, false
		c.sq.backNow = true
	default:
		c.sq.idleSeen = c.sq.posted
		c.sq.idleTimer.Reset(creditIdle)
	}
}

// returnUnused sends the credits idleCredits or onRecall gave back,
// unless an ask took them ahead of itself (askCredits).
func (c *conn) returnUnused() {
	c.sq.backQueued.Store(false)
	if n := c.sq.creditBack.Swap(0); n > 0 {
		c.writeControl(rc.CtrlBack, binary.BigEndian.AppendUint32(nil, uint32(n)))
	}
}

// onRecall serves the receiver's recall: others wait for credits. What
// this side holds and cannot use now goes back: all of it when no
// message waits, and when the first waiting chain needs more than it
// holds, which then asks again for the whole chain. So a chain never
// holds part of its credits while waiting for the rest. The give-back
// goes ahead of the ask, even one whose job was queued before it
// (askCredits).
func (c *conn) onRecall() {
	c.sq.postMu.Lock()
	defer c.postUnlock()
	c.pullLocked()
	c.drainLocked()
	if c.sq.credits <= 0 || c.life.Err() != nil {
		return
	}
	waiting := c.sq.pending.Len() > 0
	if waiting && c.sq.credits >= needCredits(c.sq.pending.Items()[0].wrs) {
		return // it waits for room in the send queue, not for credits
	}
	c.sq.creditBack.Add(int64(c.sq.credits))
	c.sq.credits = 0
	c.sq.backNow = true
	if waiting {
		c.sq.asked, c.sq.askNow = true, true // after the give-back (askCredits)
	}
}

// takeTotalLocked takes the credits a total from the peer adds to what
// this side saw. Caller holds postMu.
func (c *conn) takeTotalLocked(total uint32) {
	d := int32(total - c.sq.creditSeen)
	if d <= 0 {
		return
	}
	c.sq.creditSeen = total
	c.addCreditsLocked(int(d))
}

// pullLocked takes the credits the peer wrote into the credit word since
// the last look. Caller holds postMu.
func (c *conn) pullLocked() {
	if c.cr.cw.mr != nil {
		c.takeTotalLocked(atomic.LoadUint32(c.cr.cw.word(creditWordIn)))
	}
}
