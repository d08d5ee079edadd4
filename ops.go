package rdma

import (
	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// onCompletion hands the completion of a WR of the connection to what
// posted it, once: the op table gives each wr_id's op to the first who
// takes it, the completion or the teardown (resolveLeft). It runs on a
// poller.
func (c *conn) onCompletion(wc *verbs.WorkCompletion) {
	o, ok := c.ops.Take(wc.WRID)
	if !ok || c.holdForVerdict(&o, nil, wc) {
		return
	}
	c.complete(&o, wc)
}

// complete hands the completion of o to what posted it. It runs on a
// poller.
func (c *conn) complete(o *rc.Op, wc *verbs.WorkCompletion) {
	switch o.Kind {
	case rc.OpRecv:
		c.rq.OnRecv(o.Buf, wc)
	case rc.OpBeacon:
		c.rq.OnBeacon(wc)
		c.life.OpDone()
	case rc.OpCredit:
		c.onCreditWritten(wc)
	default:
		c.onSendDone(o, wc)
	}
}

// resolveLeft resolves the operations still in the table, for which no
// completion will come: each once (take), a receive's buffer back to the
// pool, every other operation failed with the connection's error.
func (c *conn) resolveLeft() {
	for _, id := range c.ops.IDs() {
		if o, ok := c.ops.Take(id); ok {
			switch o.Kind {
			case rc.OpBeacon, rc.OpCredit:
			case rc.OpRecv:
				o.Buf.Release()
			default:
				o.Resolve(c.life.ClosedErr(), 0, 0)
				o.DropBuf()
			}
			c.life.OpDone()
		}
	}
}
