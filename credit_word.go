package rdma

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/rc"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Credits in band.
//
// A receiver gives credits back as its application takes messages
// (creditState); it tells the sender by an RDMA WRITE of the total it has
// given over the connection's life into the sender's credit word, as
// FaRM and NCCL do, so no credit return crosses the control channel or
// wakes a goroutine on either side. The word is 4 bytes of the sender's
// registered memory behind an rkey of its own, exactly that range with
// remote write, announced in the hello. The total is a 32-bit counter
// that wraps: what a word adds is its difference to the total the sender
// saw last, and a word older than that (a WRITE that was overtaken)
// adds nothing.
//
// A WRITE wakes no one, so the sender reads its word when it is short of
// credits, before it asks. Only a sender that still waits after reading
// it asks on the control channel, with the total it saw; the receiver
// answers the ask with a frame carrying its total as soon as that is
// beyond what the sender saw, at once if it already is (a WRITE in
// flight). So a sender that holds credits never waits, and a sender
// that waits learns of its credits within one frame. Giving back unused
// credits and recalls stay on the control channel: they come after a
// second idle, or when connections wait.
//
// One credit WRITE is in flight at a time, signaled, in a send queue
// slot of its own beyond the send depth: its completion posts the next
// when the total moved meanwhile, so the WRITEs of a burst of grants
// collapse into one or two.

// The layout of a connection's credit buffer: the word the peer writes,
// and the total this side last wrote to the peer's, the WRITE's source.
const (
	creditWordIn  = 0
	creditWordOut = 8
)

// creditWord is a connection's side of the in-band credits.
type creditWord struct {
	buf ieng.Cell // registered memory for both words
	mr  verbs.MR  // the 4 bytes at creditWordIn, for the peer to write

	// The credits given over the connection's life; the
	// total of the WRITE in flight; whether one is; an ask left to
	// answer in a frame, and the total its sender had seen.
	total   atomic.Uint32
	written atomic.Uint32
	writing atomic.Bool
	askOpen atomic.Bool
	askSeen atomic.Uint32
	// The WRITE's request, kept here (one is in flight at a time) so
	// that posting it allocates nothing: the provider's PostSend is an
	// interface call, and arrays passed to it escape.
	wr  [1]verbs.SendWR
	sge [1]verbs.SGE
}

// makeCreditWord registers the connection's credit word. Connections
// without a control channel (rdma_cm) have no credits.
func (c *conn) makeCreditWord() error {
	if c.ctl.ctrl == nil || c.srq == nil {
		return nil
	}
	b, err := c.eng.Cells.Get(c.eng.PD)
	if err != nil {
		return fmt.Errorf("rdma: credit word: %w", err)
	}
	mr, err := c.eng.PD.RegMR(b.Mem[creditWordIn:creditWordIn+4], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		c.eng.Cells.Put(b)
		return fmt.Errorf("rdma: register the credit word: %w", err)
	}
	c.cr.cw.buf, c.cr.cw.mr = b, mr
	return nil
}

// closeCreditWord deregisters the credit word. The QP is closed: no
// WRITE of either side's can touch it any more, and no credit WRITE of
// ours is being made (postCreditLocked holds inflight). A late look at the
// word (the idle timer) finds no mr, under postMu.
func (c *conn) closeCreditWord() error {
	c.sq.postMu.Lock()
	mr := c.cr.cw.mr
	c.cr.cw.mr = nil
	c.unlockPost()
	if mr == nil {
		return nil
	}
	err := mr.Close()
	c.eng.Cells.Put(c.cr.cw.buf)
	return err
}

// word returns the uint32 at off of the credit buffer.
func (w *creditWord) word(off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&w.buf.Mem[off]))
}

// tellCredits tells the peer the credits given so far: in a frame when it
// waits on an ask, else by a WRITE into its credit word. It runs under
// locks of the SRQ and the receive path, so it only posts or queues.
func (c *conn) tellCredits() {
	if c.cr.cw.askOpen.Load() || c.peer.CreditRKey == 0 {
		if !c.cr.creditQueued.Swap(true) {
			c.later(c.cr.returnCreditsJob)
		}
		return
	}
	if !c.cr.cw.writing.Swap(true) {
		c.postCredit()
	}
}

// returnCredits answers an open ask on the control worker: a frame with
// the total, once it is beyond what the asking sender saw; until then
// the next grant comes back here. Without a credit word on the peer
// every grant goes this way.
func (c *conn) returnCredits() {
	c.cr.creditQueued.Store(false)
	t := c.cr.cw.total.Load()
	if c.peer.CreditRKey != 0 {
		if !c.cr.cw.askOpen.Load() || t == c.cr.cw.askSeen.Load() {
			return
		}
		c.cr.cw.askOpen.Store(false)
	}
	c.writeControl(rc.CtrlCredit, binary.BigEndian.AppendUint32(nil, t))
}

// request is the credit WRITE of wr_id id: the total given so far, put
// in the outgoing word now, into the peer's credit word, inline when the
// QP carries 4 bytes inline. It is kept in w (one is in flight at a
// time), so that posting it allocates nothing. The caller holds postMu,
// and the buffer is registered (mr).
func (w *creditWord) request(id uint64, inline int, peer *rc.Hello) []verbs.SendWR {
	t := w.total.Load()
	w.written.Store(t)
	atomic.StoreUint32(w.word(creditWordOut), t)
	w.sge[0] = verbs.SGE{Addr: w.buf.Addr + creditWordOut, Length: 4, LKey: w.buf.LKey}
	flags := verbs.SendSignaled
	if inline >= 4 {
		flags |= verbs.SendInline
	}
	w.wr[0] = verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: flags, SGL: w.sge[:],
		RemoteAddr: peer.CreditAddr, RKey: peer.CreditRKey}
	return w.wr[:]
}

// onCreditWritten completes a credit WRITE, and posts the next when the
// total moved since. It runs on a poller.
func (c *conn) onCreditWritten(wc *verbs.WorkCompletion) {
	defer c.life.OpDone()
	if wc.Status != verbs.WCSuccess {
		c.fail(c.completionErr(postedWC(rc.OpCredit, wc)))
		return
	}
	c.cr.cw.writing.Store(false)
	if c.cr.cw.total.Load() != c.cr.cw.written.Load() && !c.cr.cw.writing.Swap(true) {
		c.postCredit()
	}
}

// onCreditAsk's answer: the ask is open until a frame answers it.
func (w *creditWord) openAsk(seen uint32) {
	w.askSeen.Store(seen)
	w.askOpen.Store(true)
}
