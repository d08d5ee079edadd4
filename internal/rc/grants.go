package rc

import (
	"encoding/binary"
	"sync"
	"sync/atomic"

	ieng "github.com/go-rdma/rdma/internal/engine"
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
// (SendQueue.PostCredit); asks and their answers, give-backs and recalls go on
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

// Grants are the receiving half of a connection's credits: those the
// shared receive queue gives its peer, and the credit word that tells the
// peer of them. The shared receive queue reaches them as an
// engine.Grantee. Their fields are atomic; the comment of one that
// changes under a lock says which. The sending half is the send queue's.
type Grants struct {
	creditOut   atomic.Int64  // credits the peer holds or used on messages not yet here
	creditHeld  atomic.Int64  // messages here the application has not taken
	creditTaken atomic.Int64  // messages taken whose credits are not given back yet; added to under rmu, swapped by the SRQ too (WaitsForRoom)
	peerWants   atomic.Bool   // the peer asked for credits and gave none back since
	short       atomic.Uint32 // shortAsk | shortChain: give back takes at once
	recalled    atomic.Bool   // a Recall went to the peer, unanswered and with no grant since
	spare       atomic.Bool   // credits went to the peer beyond what it asked for since its last ask
	lookRecvs   atomic.Uint64 // messages received at the last decay look (LookQuiet)

	cw           CreditWord  // in-band credits
	creditQueued atomic.Bool // returnJob is queued
	recallQueued atomic.Bool // recallJob is queued
	returnJob    func()      // g.returnCredits, bound once: a method value allocates
	recallJob    func()      // g.sendRecall

	// The parts they work with, set by Init and SetSRQ, read-only after.
	depth  int            // the receive depth: the most credits the peer may hold (WithQueueDepth)
	rmu    *sync.Mutex    // the receive side's lock (Receiver.Mutex), under which takes are counted
	recvs  *atomic.Uint64 // the messages received, for the decay look
	life   *Life
	sq     *SendQueue // posts the credit WRITEs
	peer   *Hello
	inBand bool // there is a control channel: credits are given
	owner  Owner
	srq    *ieng.SRQ
}

// Init makes the grants of a connection of receive depth depth: rmu is
// its receive side's lock, recvs its count of messages received; life,
// sq and peer are its own, and owner the connection. inBand says it has
// a control channel: without one (rdma_cm) no credits are given.
func (g *Grants) Init(depth int, rmu *sync.Mutex, recvs *atomic.Uint64, life *Life, sq *SendQueue, peer *Hello, inBand bool, owner Owner) {
	g.depth, g.rmu, g.recvs, g.life, g.sq, g.peer, g.inBand, g.owner = depth, rmu, recvs, life, sq, peer, inBand, owner
	g.returnJob, g.recallJob = g.returnCredits, g.sendRecall
}

// SetSRQ gives the grants the shared receive queue their credits come
// from.
func (g *Grants) SetSRQ(srq *ieng.SRQ) { g.srq = srq }

// Word is the credit word the peer writes and this side's WRITEs come
// from.
func (g *Grants) Word() *CreditWord { return &g.cw }

// Out is the credits the peer holds or used on messages not yet here.
func (g *Grants) Out() int64 { return g.creditOut.Load() }

// Counts reads the credits out, the messages held and those taken whose
// credits are not given back yet: under the receive side's lock, they
// add up to the receive depth at rest.
func (g *Grants) Counts() (out, held, taken int64) {
	return g.creditOut.Load(), g.creditHeld.Load(), g.creditTaken.Load()
}

// The receiving side.

// sendRecall asks the peer for the credits it does not use.
func (g *Grants) sendRecall() {
	g.recallQueued.Store(false)
	g.owner.WriteControl(CtrlRecall, nil)
}

// Recall asks c's peer for its unused credits, once until it answers or
// is given more. Caller holds srq.mu.
func (g *Grants) Recall() {
	if g.life.Err() != nil || g.creditOut.Load() <= 0 || g.recalled.Swap(true) {
		return
	}
	if !g.recallQueued.Swap(true) {
		g.owner.Later(g.recallJob)
	}
}

// CreditRoom is how many more credits c may give: its cap less the
// credits out, the messages not yet taken and those taken whose credits
// are not given back yet. It reads them in that order, and a message
// moving from one to the next (Arrived, TookLocked) is added to the next
// before it leaves the one before: a look racing with the move counts it
// once or twice, never not at all, so the SRQ never grants past the cap.
func (g *Grants) CreditRoom() int {
	return g.depth - int(g.creditOut.Load()+g.creditHeld.Load()+g.creditTaken.Load())
}

// Arrived accounts for a message from the peer: it used a credit. A
// message without one breaks the protocol.
func (g *Grants) Arrived() bool {
	g.creditHeld.Add(1) // before creditOut falls: CreditRoom
	if g.creditOut.Add(-1) < 0 {
		g.creditOut.Add(1)
		g.creditHeld.Add(-1)
		g.owner.ProtocolErr("a message without a credit")
		return false
	}
	g.srq.Arrived()
	return true
}

// creditBatch is how many taken messages' credits go back in one frame
// (returnBatch). Each frame costs a wake, a write and a read on both
// sides, so with many connections, each seeing a message at a time, the
// batch bounds the rate (docs/connections.md); a larger batch would
// shrink the window a stream counts on. A sender that waits for credits
// never waits for a batch to fill: its ask gives back what was taken
// (OnAsk).
func (g *Grants) creditBatch() int64 { return int64(ReturnBatch(g.depth)) }

// The marks of Grants.short: why takes go back at once.
const (
	// shortAsk: the peer's last ask found too little room; the next give
	// clears it.
	shortAsk = 1 << iota
	// shortChain: the SRQ passed the peer's first chain over for room
	// its messages hold (WaitsForRoom); a grant clears it (Give).
	shortChain
)

// TookLocked accounts for a message the application took: its credit
// goes back to the peer in a batch, or at once when the peer has none
// left, or when its last ask was short or its waiting chain needs the
// room (short), or to the SRQ at once when other connections wait for
// credits. Caller holds rmu.
func (g *Grants) TookLocked() {
	taken := g.creditTaken.Add(1) // before creditHeld falls: CreditRoom
	g.creditHeld.Add(-1)
	if taken >= g.creditBatch() || g.creditOut.Load() == 0 || g.short.Load() != 0 || g.srq.OthersWait(g) {
		if g.short.Load()&shortAsk != 0 {
			g.short.And(^uint32(shortAsk))
		}
		g.giveTakenLocked(true)
	}
}

// giveTakenLocked gives the peer back the credits of the messages taken
// since the last time, when regrant is set and the peer wants them; else
// it only makes them room for an ask to give. Caller holds rmu.
func (g *Grants) giveTakenLocked(regrant bool) {
	k := g.creditTaken.Swap(0)
	if k == 0 {
		return
	}
	g.srq.Taken(k)
	if regrant && g.peerWants.Load() && g.life.Err() == nil {
		g.srq.Regrant(g, int(k))
	}
}

// OnAsk serves the peer's request for want credits, need of them
// at once for its first chain of chain credits (need is net of what the
// peer holds), having seen seen of the total given. The peer waits, so
// the credits of messages taken count at once, without waiting for
// their batch; if the ask is still short, the next take is given back
// at once, and while its first chain is passed over for room every take
// until it is served (WaitsForRoom).
func (g *Grants) OnAsk(want, seen, need, chain uint32) {
	g.cw.OpenAsk(seen)
	g.peerWants.Store(true)
	g.recalled.Store(false)
	g.spare.Store(false) // it is short: what it holds, its first chain needs
	w := int(min(want, MaxAsk))
	// Under rmu, with the takes: a take between the flush and the mark
	// would keep its credit until a batch fills. The mark counts the
	// whole ask, credits on their way to the peer included (the SRQ nets
	// them, under its lock): at worst one take more goes back at once.
	g.rmu.Lock()
	g.giveTakenLocked(false)
	if w > g.CreditRoom() {
		g.short.Or(shortAsk)
	} else {
		g.short.And(^uint32(shortAsk))
	}
	g.rmu.Unlock()
	// Credits given that the peer had not seen when it asked (a WRITE in
	// flight) count toward its ask; beyond it, they are spare.
	if g.srq.Ask(g, w, int(min(need, MaxAsk)), int(min(chain, MaxAsk)), seen) {
		g.spare.Store(true)
	}
	// Answer at once when the peer has credits it has not seen (a WRITE
	// in flight); else the next grant answers.
	if !g.creditQueued.Swap(true) {
		g.owner.Later(g.returnJob)
	}
}

// OnBack takes back credits the peer did not use: all it held.
// Its asks before are void (GiveBack); if messages still wait, its next
// ask follows (askCredits sends a give-back ahead of the ask computed
// after it).
func (g *Grants) OnBack(n uint32) {
	if int64(n) > g.creditOut.Load() {
		g.owner.ProtocolErr("gave back %d credits, holding %d", n, g.creditOut.Load())
		return
	}
	g.peerWants.Store(false)
	g.short.And(^uint32(shortChain)) // its ask is void
	g.recalled.Store(false)
	g.spare.Store(false)
	// The peer is idle: the credits of messages taken since the last
	// batch need no receives kept for them either, only room to give.
	g.rmu.Lock()
	g.giveTakenLocked(false)
	g.rmu.Unlock()
	if g.creditOut.Add(-int64(n)) > 0 {
		// Credits given after the peer gave these back may sit at it
		// unused (or be messages on their way): a Recall may get them.
		g.spare.Store(true)
	}
	g.srq.GiveBack(g, int(n))
}

// Owe records n credits given to the peer and tells it (tellCredits).
// It runs on pollers, consumers and the control reader, under locks of
// theirs, so it never writes to the control channel itself.
func (g *Grants) Owe(n int) {
	if n <= 0 || !g.inBand {
		return
	}
	g.cw.Give(n)
	g.tellCredits()
}

// The grants' side of the engine's seam: the shared receive queue
// reaches a connection's grants through these methods (engine.Grantee).

// CreditCap is the most credits the connection may give at once.
func (g *Grants) CreditCap() int { return g.depth }

// Give records k credits given to the peer and tells it. Its waiting
// chain was served: takes go back in batches again.
func (g *Grants) Give(k int, ahead bool) {
	g.creditOut.Add(int64(k))
	if g.recalled.Load() {
		g.recalled.Store(false) // it may be recalled again
	}
	g.Owe(k)
	// Marked after the counts: an ask or a give-back racing with this
	// either counts these credits or sees the mark (OnAsk,
	// OnBack).
	if ahead && !g.spare.Load() {
		g.spare.Store(true)
	}
	if g.short.Load()&shortChain != 0 {
		g.short.And(^uint32(shortChain))
	}
}

// CreditsOut is what the peer holds or used on messages not yet here.
func (g *Grants) CreditsOut() int64 { return g.creditOut.Load() }

// Given is the credits given over the connection's life: Give adds
// them, under the SRQ's lock, before it returns.
func (g *Grants) Given() uint32 { return g.cw.Total() }

// Spare reports whether the peer was given credits ahead of its asks.
func (g *Grants) Spare() bool { return g.spare.Load() }

// WaitsForRoom marks the peer's first chain as waiting for room: each
// take gives its credit back at once (TookLocked) until it is served
// (Give), and the credits of the takes before are the SRQ's now. The
// mark comes before the swap, and a take counts itself before it looks
// at the mark: a take's credit is either swapped here or given back by
// the take. It runs under the SRQ's lock, without rmu: creditTaken is
// only swapped.
func (g *Grants) WaitsForRoom() int {
	g.short.Or(shortChain)
	return int(g.creditTaken.Swap(0))
}

// LookQuiet recalls the credits of a peer that holds some and had no
// message since the last look, and reports whether it holds any. A
// sender that went quiet may never read credits written into its word
// after its idle timer stopped (it looks when it sends), and they would
// keep receives posted for ever.
func (g *Grants) LookQuiet() bool {
	if g.creditOut.Load() <= 0 {
		return false
	}
	if n := g.recvs.Load(); n != g.lookRecvs.Load() {
		g.lookRecvs.Store(n)
		return true
	}
	// A Recall of the burst may have found its messages waiting (they
	// keep their credits) and left recalled set: quiet for a whole look,
	// the connection is asked again, once a look.
	g.recalled.Store(false)
	g.Recall()
	return true
}

// Leave takes the connection off its shared receive queue at
// teardown, with the credits it held and gave: no message of its can
// come any more.
func (g *Grants) Leave() {
	g.rmu.Lock()
	held := g.creditHeld.Swap(0) + g.creditTaken.Swap(0)
	g.rmu.Unlock()
	g.srq.Leave(g, held, int(g.creditOut.Swap(0)))
}

// tellCredits tells the peer the credits given so far: in a frame when it
// waits on an ask, else by a WRITE into its credit word. It runs under
// locks of the SRQ and the receive path, so it only posts or queues.
func (g *Grants) tellCredits() {
	if g.cw.AskOpen() || g.peer.CreditRKey == 0 {
		if !g.creditQueued.Swap(true) {
			g.owner.Later(g.returnJob)
		}
		return
	}
	if g.cw.StartWrite() {
		g.sq.PostCredit()
	}
}

// returnCredits answers an open ask on the control worker: a frame with
// the total, once it is beyond what the asking sender saw; until then
// the next grant comes back here. Without a credit word on the peer
// every grant goes this way.
func (g *Grants) returnCredits() {
	g.creditQueued.Store(false)
	t := g.cw.Total()
	switch {
	case g.cw.AskOpen():
		if !g.cw.AnswerAsk(t) {
			return // nothing beyond what the asker saw: the next grant answers
		}
	case g.peer.CreditRKey != 0:
		return // the WRITEs tell a peer with a word; frames answer its asks
	}
	g.owner.WriteControl(CtrlCredit, binary.BigEndian.AppendUint32(nil, t))
}

// CreditWritten takes the successful completion of a credit WRITE, and
// posts the next when the total moved since. The WRITE's credits are in
// the peer's word now: a recall the peer read before they landed found
// none of them and was answered with nothing, so the grants may be
// recalled again (the SRQ's next retry does), or those credits would
// sit unused in the word while another connection waits for them.
func (g *Grants) CreditWritten() {
	if g.recalled.Load() {
		g.recalled.Store(false)
	}
	if g.cw.WriteDone() {
		g.sq.PostCredit()
	}
}

// Failed reports whether the connection failed: the SRQ serves it no
// more.
func (g *Grants) Failed() bool { return g.life.Err() != nil }

// ReturnBatch is how many receives a connection of receive depth depth
// gives back at once, an eighth of them: the credits of messages taken
// (with a shared receive queue) or its own receives re-posted (without).
// One frame or one chain for many bounds the cost per message; the
// receive window counts on no more than a batch less one being out of
// the peer's hands.
func ReturnBatch(depth int) int { return max(1, depth/8) }
