package engine

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/pool"
)

// fakeConn is a connection on the rig's SRQ, a Grantee, with the peer
// that sends to it. Both halves follow the root package's Conn (the
// function each method models is named in its comment): the receiving
// side's credit state (creditState) and the sending side's credits and
// queue of chains waiting (sendq.go). Their control channel carries
// frames in order each way, each written by a job of the writer's
// control worker (Conn.later), and the steps of the rig run the jobs
// and deliver the frames one at a time; the in-band credit word is
// written at once (a credit WRITE that lands at once), and the sender
// reads it when it looks, as Conn.pullLocked does. What the model leaves
// out: the send queue's room (it never fills) and the batching of credit
// WRITEs.
type fakeConn struct {
	r     *grantRig
	id    int
	cap   int  // WithQueueDepth's receive depth: CreditCap
	reads bool // its application takes the messages that arrive

	left, failed bool

	// The receiving side, at the SRQ.
	out       int // creditOut: credits the peer holds or used on messages not yet here
	held      int // creditHeld: messages here not taken
	taken     int // creditTaken: messages taken, their credits not given back
	bufs      []*pool.Buffer
	inflight  int // messages sent, not yet handed to the engine
	peerWants bool
	peerShort bool // creditState.short's shortAsk
	roomWait  bool // and its shortChain
	recalled  bool
	spare     bool
	total     uint32 // creditWord.total: credits given over its life
	askOpen   bool
	askSeen   uint32
	recvs     uint64 // messages received, for LookQuiet
	lookRecvs uint64

	recallQueued, creditQueued bool
	rjobs                      []ctlJob   // the receiver's control worker
	toSender                   []ctlFrame // frames on their way to the sender

	// The sending side, the peer.
	word       uint32 // its credit word: the total of the last credit WRITE
	seen       uint32 // creditWord.seen
	credits    int
	pending    []int // the chains waiting, oldest first: credits each needs
	asked      bool
	askNow     bool
	backNow    bool
	askQueued  bool
	backQueued bool
	creditBack int
	sqPosted   uint64 // messages posted
	unsettled  int    // messages whose send completions did not come yet
	idleArmed  bool
	idleSeen   uint64

	sjobs  []ctlJob   // the sender's control worker
	toRecv []ctlFrame // frames on their way to the receiver
}

// ctlJob is a job of a control worker; each writes one frame, or none.
type ctlJob uint8

const (
	jobAsk     ctlJob = iota // Conn.askCredits
	jobBack                  // Conn.returnUnused
	jobRecall                // Conn.sendRecall
	jobCredits               // Conn.returnCredits
)

// ctlFrame is a control frame: an ask (want, seen, need, chain), a
// give-back (n), a recall, or credits (total).
type ctlFrame struct {
	kind                 ctlJob // the job that wrote it
	n, seen, need, chain uint32
}

func (c *fakeConn) String() string {
	return fmt.Sprintf("c%d cap %d reads %v failed %v: out %d held %d taken %d | sender: credits %d unseen %d pending %v asked %v back %d | jobs s%v r%v frames →r%v →s%v",
		c.id, c.cap, c.reads, c.failed, c.out, c.held, c.taken, c.credits, int32(c.total-c.seen), c.pending, c.asked,
		c.creditBack, c.sjobs, c.rjobs, c.toRecv, c.toSender)
}

// Grantee. These run under the SRQ's lock: they call nothing of it.

// CreditRoom is Conn.creditRoom.
func (c *fakeConn) CreditRoom() int { return c.cap - c.out - c.held - c.taken }

// CreditCap is the receive depth.
func (c *fakeConn) CreditCap() int { return c.cap }

// Give records k credits given and tells the peer: endpoint.Give,
// Conn.owe and Conn.tellCredits.
func (c *fakeConn) Give(k int, ahead bool) {
	if c.left {
		c.r.breach("c%d was given %d credits after it left", c.id, k)
		return
	}
	if k <= 0 || k > c.CreditRoom() {
		c.r.breach("c%d was given %d credits with room for %d", c.id, k, c.CreditRoom())
	}
	if ahead {
		c.spare = true
	}
	c.roomWait = false
	c.out += k
	c.recalled = false
	c.total += uint32(k)
	c.r.logf("  c%d given %d (ahead %v)", c.id, k, ahead)
	if c.askOpen {
		// The peer waits on its ask: a frame answers it.
		if !c.creditQueued {
			c.creditQueued = true
			c.rjobs = append(c.rjobs, jobCredits)
		}
		return
	}
	c.word = c.total // the credit WRITE
}

// CreditsOut is creditOut.
func (c *fakeConn) CreditsOut() int64 { return int64(c.out) }

// Spare reports credits given ahead of the peer's asks.
func (c *fakeConn) Spare() bool { return c.spare }

// WaitsForRoom is endpoint.WaitsForRoom.
func (c *fakeConn) WaitsForRoom() int {
	c.roomWait = true
	k := c.taken
	c.taken = 0
	if k > 0 {
		c.r.logf("  c%d waits for room: %d taken come back", c.id, k)
	}
	return k
}

// Recall is Conn.recall.
func (c *fakeConn) Recall() {
	if c.left {
		c.r.breach("c%d was recalled after it left", c.id)
		return
	}
	if c.failed || c.out <= 0 || c.recalled {
		return
	}
	c.recalled = true
	c.r.logf("  c%d recalled", c.id)
	if !c.recallQueued {
		c.recallQueued = true
		c.rjobs = append(c.rjobs, jobRecall)
	}
}

// LookQuiet is endpoint.LookQuiet.
func (c *fakeConn) LookQuiet() bool {
	if c.out <= 0 {
		return false
	}
	if c.recvs != c.lookRecvs {
		c.lookRecvs = c.recvs
		return true
	}
	c.recalled = false
	c.Recall()
	return true
}

// Failed reports whether it failed.
func (c *fakeConn) Failed() bool { return c.failed }

// The receiving side.

// arrived is Conn.arrived, for a message that took pb.
func (c *fakeConn) arrived(pb *pool.Buffer) {
	c.bufs = append(c.bufs, pb)
	c.recvs++
	if c.out--; c.out < 0 {
		c.out++
		c.r.breach("c%d: a message without a credit", c.id)
		return
	}
	c.r.s.Arrived()
	c.held++
}

// took is Conn.tookLocked: the application took a message.
func (c *fakeConn) took() {
	c.bufs[0].Release()
	c.bufs = c.bufs[1:]
	c.held--
	c.taken++
	if c.taken >= max(1, c.cap/8) || c.out == 0 || c.peerShort || c.roomWait || c.r.s.OthersWait(c) {
		c.peerShort = false
		c.giveTaken(true)
	}
}

// giveTaken is Conn.giveTakenLocked.
func (c *fakeConn) giveTaken(regrant bool) {
	k := c.taken
	c.taken = 0
	if k == 0 {
		return
	}
	s := c.r.s
	s.Taken(int64(k))
	if regrant && c.peerWants && !c.failed {
		s.Regrant(c, k)
		c.r.clock()
	}
}

// onCreditAsk is Conn.onCreditAsk.
func (c *fakeConn) onCreditAsk(want, seen, need, chain uint32) {
	c.askSeen, c.askOpen = seen, true
	c.peerWants = true
	c.recalled = false
	c.spare = false
	unseen := max(0, int(int32(c.total-seen)))
	w := int(min(want, MaxAsk)) - unseen
	if w < 0 {
		c.spare = true
	}
	n := int(min(need, MaxAsk)) - unseen
	ch := int(min(chain, MaxAsk))
	if n <= 0 {
		n, ch = 1, 1
	}
	c.giveTaken(false)
	c.peerShort = w > c.CreditRoom()
	c.r.s.Ask(c, w, n, ch)
	c.r.clock()
	if !c.creditQueued {
		c.creditQueued = true
		c.rjobs = append(c.rjobs, jobCredits)
	}
}

// onCreditBack is Conn.onCreditBack.
func (c *fakeConn) onCreditBack(n uint32) {
	if int(n) > c.out {
		c.r.breach("c%d's peer gave back %d credits, holding %d", c.id, n, c.out)
		return
	}
	c.peerWants = false
	c.roomWait = false
	c.recalled = false
	c.spare = false
	c.giveTaken(false)
	if c.out -= int(n); c.out > 0 {
		c.spare = true // given after the peer gave these back, or messages on their way
	}
	c.r.s.GiveBack(c, int(n))
	c.r.clock()
}

// runRecvJob runs the receiver's oldest control job.
func (c *fakeConn) runRecvJob() {
	j := c.rjobs[0]
	c.rjobs = c.rjobs[1:]
	switch j {
	case jobRecall: // Conn.sendRecall
		c.recallQueued = false
		c.toSender = append(c.toSender, ctlFrame{kind: jobRecall})
		c.r.logf("c%d recall sent", c.id)
	case jobCredits: // Conn.returnCredits
		c.creditQueued = false
		if !c.askOpen || c.total == c.askSeen {
			return
		}
		c.askOpen = false
		c.toSender = append(c.toSender, ctlFrame{kind: jobCredits, n: c.total})
		c.r.logf("c%d credits sent (total %d)", c.id, c.total)
	}
}

// deliverToRecv hands the oldest frame from the sender to the receiver.
func (c *fakeConn) deliverToRecv() {
	f := c.toRecv[0]
	c.toRecv = c.toRecv[1:]
	switch f.kind {
	case jobAsk:
		c.r.logf("c%d asks want %d need %d chain %d seen %d", c.id, f.n, f.need, f.chain, f.seen)
		c.onCreditAsk(f.n, f.seen, f.need, f.chain)
	case jobBack:
		c.r.logf("c%d gives back %d", c.id, f.n)
		c.onCreditBack(f.n)
	}
}

// fail ends the connection: nothing more is sent or answered; the rig
// tears it down later (stepLeaveFailed).
func (c *fakeConn) fail() {
	c.failed = true
	c.dropSender()
	c.rjobs, c.toSender = nil, nil
}

// dropSender ends the peer: its chains and credits are gone.
func (c *fakeConn) dropSender() {
	c.pending, c.sjobs, c.toRecv = nil, nil, nil
	c.credits, c.creditBack = 0, 0
	c.unsettled = 0
}

// backInFlight is what the sender gives back and the receiver has not
// taken back yet.
func (c *fakeConn) backInFlight() int {
	n := c.creditBack
	for _, f := range c.toRecv {
		if f.kind == jobBack {
			n += int(f.n)
		}
	}
	return n
}

// The sending side.

func (c *fakeConn) pendingMsgs() int {
	n := 0
	for _, k := range c.pending {
		n += k
	}
	return n
}

// post queues a chain of n messages and sends what fits: Batch.Post.
func (c *fakeConn) post(n int) {
	c.pending = append(c.pending, n)
	c.drain()
	c.postUnlock()
}

// takeTotal is Conn.takeTotalLocked.
func (c *fakeConn) takeTotal(total uint32) {
	d := int32(total - c.seen)
	if d <= 0 {
		return
	}
	c.seen = total
	c.addCredits(int(d))
}

// pull is Conn.pullLocked: it reads the credit word.
func (c *fakeConn) pull() { c.takeTotal(c.word) }

// addCredits is Conn.addCreditsLocked.
func (c *fakeConn) addCredits(n int) {
	c.credits += n
	if c.credits > 0 && !c.idleArmed {
		c.idleArmed, c.idleSeen = true, c.sqPosted
	}
}

// room is Conn.roomLocked for a chain that needs need credits.
func (c *fakeConn) room(need int) bool {
	if c.credits >= need {
		return true
	}
	if c.pull(); c.credits >= need {
		return true
	}
	if !c.asked {
		c.asked, c.askNow = true, true
	}
	return false
}

// drain is Conn.drainLocked: it sends the chains that have credits,
// oldest first.
func (c *fakeConn) drain() {
	for len(c.pending) > 0 && c.room(c.pending[0]) {
		n := c.pending[0]
		c.pending = c.pending[1:]
		c.credits -= n
		c.sqPosted += uint64(n)
		c.unsettled += n
		c.r.logf("  c%d sends %d", c.id, n)
		c.r.send(c, n)
	}
}

// postUnlock queues the jobs decided under postMu: a give-back before
// an ask.
func (c *fakeConn) postUnlock() {
	if c.backNow {
		c.backNow = false
		if !c.backQueued {
			c.backQueued = true
			c.sjobs = append(c.sjobs, jobBack)
		}
	}
	if c.askNow {
		c.askNow = false
		if !c.askQueued {
			c.askQueued = true
			c.sjobs = append(c.sjobs, jobAsk)
		}
	}
}

// runSenderJob runs the sender's oldest control job.
func (c *fakeConn) runSenderJob() {
	j := c.sjobs[0]
	c.sjobs = c.sjobs[1:]
	switch j {
	case jobAsk: // Conn.askCredits
		c.askQueued = false
		c.pull()
		c.drain()
		back := c.creditBack
		c.creditBack = 0
		want, need, chain := -c.credits, 0, 0
		for i, n := range c.pending {
			if i == 0 {
				need, chain = n-c.credits, n
			}
			if want += n; want >= MaxAsk {
				break
			}
		}
		if want <= 0 {
			c.asked = false
		}
		c.postUnlock()
		if back > 0 {
			c.toRecv = append(c.toRecv, ctlFrame{kind: jobBack, n: uint32(back)})
			c.r.logf("c%d give-back sent ahead of its ask: %d", c.id, back)
		}
		if want > 0 {
			c.toRecv = append(c.toRecv, ctlFrame{kind: jobAsk, n: uint32(min(want, MaxAsk)), seen: c.seen,
				need: uint32(max(1, need)), chain: uint32(max(1, chain))})
			c.r.logf("c%d ask sent: want %d need %d chain %d", c.id, want, max(1, need), max(1, chain))
		}
	case jobBack: // Conn.returnUnused
		c.backQueued = false
		if n := c.creditBack; n > 0 {
			c.creditBack = 0
			c.toRecv = append(c.toRecv, ctlFrame{kind: jobBack, n: uint32(n)})
			c.r.logf("c%d give-back sent: %d", c.id, n)
		}
	}
}

// deliverToSender hands the oldest frame from the receiver to the sender.
func (c *fakeConn) deliverToSender() {
	f := c.toSender[0]
	c.toSender = c.toSender[1:]
	switch f.kind {
	case jobRecall:
		c.r.logf("c%d's sender answers a recall", c.id)
		c.onRecall()
	case jobCredits:
		c.r.logf("c%d's sender gets credits (total %d)", c.id, f.n)
		c.onCredit(f.n)
	}
}

// onRecall is Conn.onRecall: what the sender cannot use goes back, all
// of it when no message waits or when its first chain needs more than
// it holds; then it asks again for the whole chain.
func (c *fakeConn) onRecall() {
	defer c.postUnlock()
	c.pull()
	c.drain()
	if c.credits <= 0 {
		return
	}
	waiting := len(c.pending) > 0
	if waiting && c.credits >= c.pending[0] {
		return // it waits for room in the send queue (never, here)
	}
	c.creditBack += c.credits
	c.credits = 0
	c.backNow = true
	if waiting {
		c.asked, c.askNow = true, true
	}
}

// onCredit is Conn.onCredit: the answer to the sender's ask.
func (c *fakeConn) onCredit(total uint32) {
	c.takeTotal(total)
	c.pull()
	c.asked = false
	c.drain()
	c.postUnlock()
}

// settle is Conn.settle: send completions came, the queue drains.
func (c *fakeConn) settle() {
	c.unsettled = 0
	c.drain()
	c.postUnlock()
}

// idleCredits is Conn.idleCredits: the idle timer gives back what a
// sender that sent nothing since the last look holds.
func (c *fakeConn) idleCredits() {
	defer c.postUnlock()
	c.pull()
	c.drain()
	switch {
	case c.credits <= 0:
		c.idleArmed = false
	case c.sqPosted == c.idleSeen && len(c.pending) == 0:
		c.creditBack += c.credits
		c.credits, c.idleArmed = 0, false
		c.backNow = true
	default:
		c.idleSeen = c.sqPosted
	}
}
