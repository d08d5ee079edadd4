package rdma

import (
	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The grants tell the peer the credits they give in band, through the
// peer's credit word (rc.CreditWord), and in frames that answer its asks.

// makeCreditWord registers the connection's credit word. Connections
// without a control channel (rdma_cm) have no credits.
func (c *conn) makeCreditWord() error {
	if c.ctl.Conn() == nil || c.srq == nil {
		return nil
	}
	return c.cr.Word().Register(&c.eng.Cells, c.eng.PD)
}

// closeCreditWord deregisters the credit word, once the QP is closed.
func (c *conn) closeCreditWord() error {
	mr := c.sq.DetachCreditWord()
	if mr == nil {
		return nil
	}
	return c.cr.Word().Close(mr, &c.eng.Cells)
}

// onCreditWritten completes a credit WRITE, and posts the next when the
// total moved since. It runs on a poller.
func (c *conn) onCreditWritten(wc *verbs.WorkCompletion) {
	defer c.life.OpDone()
	if wc.Status != verbs.WCSuccess {
		c.fail(c.completionErr(postedWC(rc.OpCredit, wc)))
		return
	}
	c.cr.CreditWritten()
}
