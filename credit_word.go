package rdma

import (
	"encoding/binary"

	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The grants tell the peer the credits they give in band, through the
// peer's credit word (rc.CreditWord), and in frames that answer its asks.

// makeCreditWord registers the connection's credit word. Connections
// without a control channel (rdma_cm) have no credits.
func (c *conn) makeCreditWord() error {
	if c.ctl.ctrl == nil || c.srq == nil {
		return nil
	}
	return c.cr.cw.Register(&c.eng.Cells, c.eng.PD)
}

// closeCreditWord deregisters the credit word, once the QP is closed.
func (c *conn) closeCreditWord() error {
	mr := c.sq.DetachCreditWord()
	if mr == nil {
		return nil
	}
	return c.cr.cw.Close(mr, &c.eng.Cells)
}

// tellCredits tells the peer the credits given so far: in a frame when it
// waits on an ask, else by a WRITE into its credit word. It runs under
// locks of the SRQ and the receive path, so it only posts or queues.
func (c *conn) tellCredits() {
	if c.cr.cw.AskOpen() || c.peer.CreditRKey == 0 {
		if !c.cr.creditQueued.Swap(true) {
			c.later(c.cr.returnCreditsJob)
		}
		return
	}
	if c.cr.cw.StartWrite() {
		c.sq.PostCredit()
	}
}

// returnCredits answers an open ask on the control worker: a frame with
// the total, once it is beyond what the asking sender saw; until then
// the next grant comes back here. Without a credit word on the peer
// every grant goes this way.
func (c *conn) returnCredits() {
	c.cr.creditQueued.Store(false)
	t := c.cr.cw.Total()
	if c.peer.CreditRKey != 0 && !c.cr.cw.AnswerAsk(t) {
		return
	}
	c.writeControl(rc.CtrlCredit, binary.BigEndian.AppendUint32(nil, t))
}

// onCreditWritten completes a credit WRITE, and posts the next when the
// total moved since. It runs on a poller.
func (c *conn) onCreditWritten(wc *verbs.WorkCompletion) {
	defer c.life.OpDone()
	if wc.Status != verbs.WCSuccess {
		c.fail(c.completionErr(postedWC(rc.OpCredit, wc)))
		return
	}
	if c.cr.cw.WriteDone() {
		c.sq.PostCredit()
	}
}
