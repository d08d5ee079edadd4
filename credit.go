package rdma

import (
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/rc"
)

// Credits keep a connection's messages within receives its peer has
// posted for them, so a peer that does not read slows its sender instead
// of making it retry receiver-not-ready (RNR) without end, which on rxe
// and hardware (rnr_retry 7) never gives up.
//
// Each SEND, SEND_WITH_IMM and WRITE_WITH_IMM takes a credit; a message
// without one waits in the send queue's queue behind an
// unresolved Future. Receives come from the engine's shared receive
// queue, so credits are given on demand. Credits given back go
// in band, by an RDMA WRITE into the sender's credit word
// (postCredit); asks and their answers, give-backs and recalls go on
// the control channel:
//   - A connection starts with none. A sender that has a message and no
//     credit, and finds none new in its credit word, asks for what its
//     messages waiting need, how many of them its first waiting chain
//     needs at once and how many that chain takes (ctrlAsk; all but the
//     last net of the credits it holds). The receiver serves asks in turn
//     (the SRQ's Ask): when no other connection waits, at once and up
//     to the connection's whole cap (WithQueueDepth's receive depth) as
//     far as the SRQ's headroom and the connection's share go.
//   - As the application takes messages, the receiver gives their
//     credits back, in its credit WRITEs, in batches of an eighth of
//     the cap, while the peer wants them and no other connection waits
//     for credits; while others wait, the receives go to them. An ask
//     gives back at once what was taken and not given back yet, and
//     when even that leaves the ask short (the connection's messages
//     are not taken yet), the next take is given back at once; while
//     the SRQ passes its first chain over for room its messages hold,
//     every take is, until the chain is served (WaitsForRoom): a sender
//     that waits is never left waiting for a batch to fill.
//   - A sender that has sent nothing for creditIdle gives back what it
//     holds (ctrlBack), so idle connections hold none and the SRQ
//     serves the active ones. A give-back voids the sender's asks before
//     it (SRQ.GiveBack); a sender that still waits asks again, after it
//     (askCredits sends the give-backs ahead of its ask).
//   - When the first waiting connection needs more than the SRQ has
//     left to give, the receiver recalls (ctrlRecall) the credits of the
//     connections that may hold some they cannot use (given ahead of
//     their asks, or part of a waiting chain): a sender gives back what
//     it holds when no message waits, or when its first chain needs
//     more than it holds, and then asks again for the whole chain.
//     So a waiting connection gets credits within a round trip or two of
//     the control channel (recallGap), however many connections there
//     are, and no chain holds part of its credits while waiting for the
//     rest.
//
// A connection holds at most its cap of the SRQ, credits and messages
// not yet taken together, so a peer that floods, or an application
// that does not read, cannot take more than that. A message without a
// credit cuts the peer off (ErrProtocol). Connections set up through
// rdma_cm have no control channel: they keep receives of their own and
// send without credits.

// creditState is the receiving half of a connection's credits: those
// the shared receive queue gives its peer, and the credit word that
// tells the peer of them. Conn holds it as c.cr. Its fields are atomic;
// the comment of one that changes under a lock says which. The sending
// half is the send queue's (sendCredits).
type creditState struct {
	creditOut   atomic.Int64  // credits the peer holds or used on messages not yet here
	creditHeld  atomic.Int64  // messages here the application has not taken
	creditTaken atomic.Int64  // messages taken whose credits are not given back yet; added to under rmu, swapped by the SRQ too (WaitsForRoom)
	peerWants   atomic.Bool   // the peer asked for credits and gave none back since
	short       atomic.Uint32 // shortAsk | shortChain: give back takes at once
	recalled    atomic.Bool   // a recall went to the peer, unanswered and with no grant since
	spare       atomic.Bool   // credits went to the peer beyond what it asked for since its last ask
	lookRecvs   atomic.Uint64 // messages received at the last decay look (LookQuiet)

	cw               rc.CreditWord // in-band credits
	creditQueued     atomic.Bool   // a job to return them is queued
	returnCreditsJob func()        // c.returnCredits, bound once: a method value allocates
	recallJob        func()        // c.sendRecall
	recallQueued     atomic.Bool   // recallJob is queued
}

// init binds the jobs the grants queue: a method value allocates, so
// they are bound once.
func (g *creditState) init(returnCredits, sendRecall func()) {
	g.returnCreditsJob, g.recallJob = returnCredits, sendRecall
}

// recvCap is the credit cap this side announces in its hello: the most
// credits it can give the peer at once, its receive depth, or its SRQ's
// depth when that is smaller (every credit is backed by a posted
// receive).
func (c *conn) recvCap() int {
	if c.srq != nil {
		return min(c.cfg.rqDepth, c.srq.Depth())
	}
	return c.cfg.rqDepth
}

// The receiving side.

// sendRecall asks the peer for the credits it does not use.
func (c *conn) sendRecall() {
	c.cr.recallQueued.Store(false)
	c.writeControl(rc.CtrlRecall, nil)
}

// recall asks c's peer for its unused credits, once until it answers or
// is given more. Caller holds srq.mu.
func (c *conn) recall() {
	if c.life.Err() != nil || c.cr.creditOut.Load() <= 0 || c.cr.recalled.Swap(true) {
		return
	}
	if !c.cr.recallQueued.Swap(true) {
		c.later(c.cr.recallJob)
	}
}

// creditRoom is how many more credits c may give: its cap less the
// credits out, the messages not yet taken and those taken whose credits
// are not given back yet. It reads them in that order, and a message
// moving from one to the next (arrived, tookLocked) is added to the next
// before it leaves the one before: a look racing with the move counts it
// once or twice, never not at all, so the SRQ never grants past the cap.
func (c *conn) creditRoom() int {
	return c.cfg.rqDepth - int(c.cr.creditOut.Load()+c.cr.creditHeld.Load()+c.cr.creditTaken.Load())
}

// arrived accounts for a message from the peer: it used a credit. A
// message without one breaks the protocol.
func (c *conn) arrived() bool {
	c.cr.creditHeld.Add(1) // before creditOut falls: creditRoom
	if c.cr.creditOut.Add(-1) < 0 {
		c.cr.creditOut.Add(1)
		c.cr.creditHeld.Add(-1)
		c.protocolErr("a message without a credit")
		return false
	}
	c.srq.Arrived()
	return true
}

// creditBatch is how many taken messages' credits go back in one frame
// (returnBatch). Each frame costs a wake, a write and a read on both
// sides, so with many connections, each seeing a message at a time, the
// batch bounds the rate (docs/connections.md); a larger batch would
// shrink the window a stream counts on. A sender that waits for credits
// never waits for a batch to fill: its ask gives back what was taken
// (onCreditAsk).
func (c *conn) creditBatch() int64 { return int64(returnBatch(c.cfg.rqDepth)) }

// The marks of creditState.short: why takes go back at once.
const (
	// shortAsk: the peer's last ask found too little room; the next give
	// clears it.
	shortAsk = 1 << iota
	// shortChain: the SRQ passed the peer's first chain over for room
	// its messages hold (WaitsForRoom); a grant clears it (Give).
	shortChain
)

// tookLocked accounts for a message the application took: its credit
// goes back to the peer in a batch, or at once when the peer has none
// left, or when its last ask was short or its waiting chain needs the
// room (short), or to the SRQ at once when other connections wait for
// credits. Caller holds rmu.
func (c *conn) tookLocked() {
	taken := c.cr.creditTaken.Add(1) // before creditHeld falls: creditRoom
	c.cr.creditHeld.Add(-1)
	if taken >= c.creditBatch() || c.cr.creditOut.Load() == 0 || c.cr.short.Load() != 0 || c.srq.OthersWait(c.ep()) {
		if c.cr.short.Load()&shortAsk != 0 {
			c.cr.short.And(^uint32(shortAsk))
		}
		c.giveTakenLocked(true)
	}
}

// giveTakenLocked gives the peer back the credits of the messages taken
// since the last time, when regrant is set and the peer wants them; else
// it only makes them room for an ask to give. Caller holds rmu.
func (c *conn) giveTakenLocked(regrant bool) {
	k := c.cr.creditTaken.Swap(0)
	if k == 0 {
		return
	}
	c.srq.Taken(k)
	if regrant && c.cr.peerWants.Load() && c.life.Err() == nil {
		c.srq.Regrant(c.ep(), int(k))
	}
}

// onCreditAsk serves the peer's request for want credits, need of them
// at once for its first chain of chain credits (need is net of what the
// peer holds), having seen seen of the total given. The peer waits, so
// the credits of messages taken count at once, without waiting for
// their batch; if the ask is still short, the next take is given back
// at once, and while its first chain is passed over for room every take
// until it is served (WaitsForRoom).
func (c *conn) onCreditAsk(want, seen, need, chain uint32) {
	c.cr.cw.OpenAsk(seen)
	c.cr.peerWants.Store(true)
	c.cr.recalled.Store(false)
	c.cr.spare.Store(false) // it is short: what it holds, its first chain needs
	// Credits given that the peer had not seen when it asked (a WRITE in
	// flight) count toward its ask; beyond it, they are spare.
	unseen := max(0, int(int32(c.cr.cw.Total()-seen)))
	w := int(min(want, rc.MaxAsk)) - unseen
	if w < 0 {
		c.cr.spare.Store(true)
	}
	n := int(min(need, rc.MaxAsk)) - unseen
	ch := int(min(chain, rc.MaxAsk))
	if n <= 0 {
		n, ch = 1, 1 // its first chain has its credits: what else waits is asked for later
	}
	// Under rmu, with the takes: a take between the flush and the mark
	// would keep its credit until a batch fills.
	c.rq.rmu.Lock()
	c.giveTakenLocked(false)
	if w > c.creditRoom() {
		c.cr.short.Or(shortAsk)
	} else {
		c.cr.short.And(^uint32(shortAsk))
	}
	c.rq.rmu.Unlock()
	c.srq.Ask(c.ep(), w, n, ch)
	// Answer at once when the peer has credits it has not seen (a WRITE
	// in flight); else the next grant answers.
	if !c.cr.creditQueued.Swap(true) {
		c.later(c.cr.returnCreditsJob)
	}
}

// onCreditBack takes back credits the peer did not use: all it held.
// Its asks before are void (GiveBack); if messages still wait, its next
// ask follows (askCredits sends a give-back ahead of the ask computed
// after it).
func (c *conn) onCreditBack(n uint32) {
	if int64(n) > c.cr.creditOut.Load() {
		c.protocolErr("gave back %d credits, holding %d", n, c.cr.creditOut.Load())
		return
	}
	c.cr.peerWants.Store(false)
	c.cr.short.And(^uint32(shortChain)) // its ask is void
	c.cr.recalled.Store(false)
	c.cr.spare.Store(false)
	// The peer is idle: the credits of messages taken since the last
	// batch need no receives kept for them either, only room to give.
	c.rq.rmu.Lock()
	c.giveTakenLocked(false)
	c.rq.rmu.Unlock()
	if c.cr.creditOut.Add(-int64(n)) > 0 {
		// Credits given after the peer gave these back may sit at it
		// unused (or be messages on their way): a recall may get them.
		c.cr.spare.Store(true)
	}
	c.srq.GiveBack(c.ep(), int(n))
}

// owe records n credits given to the peer and tells it (tellCredits).
// It runs on pollers, consumers and the control reader, under locks of
// theirs, so it never writes to the control channel itself.
func (c *conn) owe(n int) {
	if n <= 0 || c.ctl.ctrl == nil {
		return
	}
	c.cr.cw.Give(n)
	c.tellCredits()
}

// The grants' side of the engine's seam: the shared receive queue
// reaches a connection's grants through these methods (engine.Grantee).

// CreditRoom is how many more credits the connection may give its peer.
func (e *endpoint) CreditRoom() int { return (*conn)(e).creditRoom() }

// CreditCap is the most credits the connection may give at once.
func (e *endpoint) CreditCap() int { return e.cfg.rqDepth }

// Give records k credits given to the peer and tells it. Its waiting
// chain was served: takes go back in batches again.
func (e *endpoint) Give(k int, ahead bool) {
	c := (*conn)(e)
	c.cr.creditOut.Add(int64(k))
	if c.cr.recalled.Load() {
		c.cr.recalled.Store(false) // it may be recalled again
	}
	c.owe(k)
	// Marked after the counts: an ask or a give-back racing with this
	// either counts these credits or sees the mark (onCreditAsk,
	// onCreditBack).
	if ahead && !c.cr.spare.Load() {
		c.cr.spare.Store(true)
	}
	if c.cr.short.Load()&shortChain != 0 {
		c.cr.short.And(^uint32(shortChain))
	}
}

// CreditsOut is what the peer holds or used on messages not yet here.
func (e *endpoint) CreditsOut() int64 { return e.cr.creditOut.Load() }

// Spare reports whether the peer was given credits ahead of its asks.
func (e *endpoint) Spare() bool { return e.cr.spare.Load() }

// Recall asks the peer for the credits it cannot use.
func (e *endpoint) Recall() { (*conn)(e).recall() }

// WaitsForRoom marks the peer's first chain as waiting for room: each
// take gives its credit back at once (tookLocked) until it is served
// (Give), and the credits of the takes before are the SRQ's now. The
// mark comes before the swap, and a take counts itself before it looks
// at the mark: a take's credit is either swapped here or given back by
// the take. It runs under the SRQ's lock, without rmu: creditTaken is
// only swapped.
func (e *endpoint) WaitsForRoom() int {
	e.cr.short.Or(shortChain)
	return int(e.cr.creditTaken.Swap(0))
}

// LookQuiet recalls the credits of a peer that holds some and had no
// message since the last look, and reports whether it holds any. A
// sender that went quiet may never read credits written into its word
// after its idle timer stopped (it looks when it sends), and they would
// keep receives posted for ever.
func (e *endpoint) LookQuiet() bool {
	c := (*conn)(e)
	if c.cr.creditOut.Load() <= 0 {
		return false
	}
	if n := c.st.recvs.Load(); n != c.cr.lookRecvs.Load() {
		c.cr.lookRecvs.Store(n)
		return true
	}
	// A recall of the burst may have found its messages waiting (they
	// keep their credits) and left recalled set: quiet for a whole look,
	// the connection is asked again, once a look.
	c.cr.recalled.Store(false)
	c.recall()
	return true
}

// leaveSRQ takes the connection off its shared receive queue at
// teardown, with the credits it held and gave: no message of its can
// come any more.
func (c *conn) leaveSRQ() {
	c.rq.rmu.Lock()
	held := c.cr.creditHeld.Swap(0) + c.cr.creditTaken.Swap(0)
	c.rq.rmu.Unlock()
	c.srq.Leave(c.ep(), held, int(c.cr.creditOut.Swap(0)))
}
