package rc

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// A completion reaches what posted its WR here: the engine's poller
// hands it to the connection (Complete, Received), the op table gives
// its wr_id's op to whoever takes it first (the completion or the
// teardown), and the op's kind says which part handles it.

// Complete hands the completion of a WR of the connection to what
// posted it, once: the op table gives each wr_id's op to the first who
// takes it, the completion or the teardown (resolveLeft). It runs on a
// poller.
func (c *Conn) Complete(wc *verbs.WorkCompletion) {
	o, ok := c.Ops.Take(wc.WRID)
	if !ok || c.vd.mayHold(wc) && c.holdForVerdict(&o, nil, wc) {
		return
	}
	c.complete(&o, wc)
}

// Received hands a message that took a receive of the SRQ on the
// connection's QP to its receive side. It runs on a poller.
func (c *Conn) Received(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	if !c.vd.mayHold(wc) || !c.holdForVerdict(nil, pb, wc) {
		c.RQ.OnSharedRecv(pb, wc)
	}
}

// complete hands the completion of o to what posted it. It runs on a
// poller.
func (c *Conn) complete(o *Op, wc *verbs.WorkCompletion) {
	switch o.Kind {
	case OpRecv:
		c.RQ.OnRecv(o.Buf, wc)
	case OpBeacon:
		c.RQ.OnBeacon(wc)
		c.Life.OpDone()
	case OpCredit:
		c.onCreditWritten(wc)
	default:
		c.onSendDone(o, wc)
	}
}

// resolveLeft resolves the operations still in the table, for which no
// completion will come: each once (take), a receive's buffer back to the
// pool, every other operation failed with the connection's error.
func (c *Conn) resolveLeft() {
	for _, id := range c.Ops.IDs() {
		if o, ok := c.Ops.Take(id); ok {
			switch o.Kind {
			case OpBeacon, OpCredit:
			case OpRecv:
				o.Buf.Release()
			default:
				o.Resolve(c.Life.ClosedErr(), 0, 0)
				o.DropBuf()
			}
			c.Life.OpDone()
		}
	}
}

// onSendDone resolves a send-side completion and every unsignaled WR it
// covers. It runs on a poller.
func (c *Conn) onSendDone(o *Op, wc *verbs.WorkCompletion) {
	k := c.SQ.TakeCovered(wc.WRID)
	c.Counters.completed(wc.Status, k, wc.Status == verbs.WCWRFlushErr && c.Life.Orderly())
	var err error
	if wc.Status != verbs.WCSuccess {
		err = c.completionErr(postedWC(o.Kind, wc))
		// Fail first: whoever sees this future resolve must also see a
		// failed connection.
		c.Fail(err)
	}
	c.Finish(o, err)
	c.SQ.Settle(k)
}

// onCreditWritten completes a credit WRITE, and posts the next when the
// total moved since. It runs on a poller.
func (c *Conn) onCreditWritten(wc *verbs.WorkCompletion) {
	defer c.Life.OpDone()
	if wc.Status != verbs.WCSuccess {
		c.Fail(c.completionErr(postedWC(OpCredit, wc)))
		return
	}
	c.Grants.CreditWritten()
}

// Finish resolves a send-side op: a signaled one (or any that failed)
// resolves its future; its buffer and credit go back. A sampled op that
// succeeded counts its latency.
func (c *Conn) Finish(o *Op, err error) {
	if err == nil && o.Start != 0 {
		c.Counters.observe(Nanotime() - o.Start)
	}
	if o.Signaled || o.Covered || err != nil {
		var old uint64
		if err == nil && o.Kind == OpAtomic {
			old = *(*uint64)(unsafe.Pointer(&o.Buf.Bytes()[0]))
		}
		o.Resolve(err, o.N, old)
	}
	o.DropBuf()
	c.Life.OpDone()
}

// FailedRecv counts a failed receive and returns its error.
func (c *Conn) FailedRecv(wc *verbs.WorkCompletion) error {
	c.Counters.recvFailed(wc.Status, wc.Status == verbs.WCWRFlushErr && c.Life.Orderly())
	return c.RecvErr(wc)
}

// RecvErr is the error a failed completion gives the Recvs waiting.
func (c *Conn) RecvErr(wc *verbs.WorkCompletion) error {
	return c.completionErr(postedWC(OpRecv, wc))
}

// completionErr is the error of a failed completion; it keeps the
// API's error of the completion (Shell.CompletionError) for errors.As,
// except after the peer's close.
//   - Once the peer's orderly close was heard, whatever fails is that
//     close's doing (the QP went to the error state, the peer tore its
//     side down): the error is the close's own (PeerClosedErr), the same
//     for every operation and for Err, with no completion status.
//   - A flush says only that the QP is in the error state, so it carries
//     the reason: the connection's first error, or, when the QP went to
//     the error state without one, the peer's end: a disconnect through
//     rdma_cm (ErrPeerClosed), else a peer that went away (ErrPeerLost).
//   - Retries exceeded means the transport gave up on the peer: it died
//     or tore its queue pair down. That is ErrPeerLost, whichever of the
//     completion and the end of the control channel comes first.
//   - A remote operational error (or abort) means the peer's queue pair
//     failed under our request. A go-rdma peer posts only receives it
//     can fill, so its side of the connection is gone: it died (rxe
//     NAKs this way while a killed process's SRQ and QPs are torn down)
//     or failed on its own. That is ErrPeerLost as well, unless the
//     peer said why (its abort): an access or invalid-request error
//     stays ours to explain.
func (c *Conn) completionErr(wc *verbs.WorkCompletion) error {
	if c.Life.CloseHeard() {
		return c.Life.PeerClosedErr()
	}
	err := c.shell.CompletionError(wc)
	switch {
	case wc.Status == verbs.WCWRFlushErr:
		cause := c.Life.Err()
		if cause == nil && c.CM != nil {
			cause = c.Life.PeerClosedErr()
		} else if cause == nil {
			cause = c.Life.PeerLostErr()
		}
		return fmt.Errorf("%w (%w)", cause, err)
	case wc.Status == verbs.WCRetryExcErr, wc.Status == verbs.WCRemOpErr, wc.Status == verbs.WCRemAbortErr,
		c.Life.PeerClosed():
		c.Life.SetPeerClosed()
		// The peer's end may carry its reason (an abort's): keep it.
		cause := c.Life.Err()
		if cause == nil || !(errors.Is(cause, ErrPeerClosed) || errors.Is(cause, ErrPeerLost)) {
			cause = c.Life.PeerLostErr()
		}
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return fmt.Errorf("rdma: peer %v: %w", c.Remote, err)
}

// postedWC is wc with the opcode of what was posted under its wr_id
// (kind), for a failed completion: the opcode field of a failed (a
// flushed) completion is undefined on many providers, and soft's reads
// SEND for every receive. The kind does not tell the two atomics apart:
// theirs stays as reported.
func postedWC(kind OpKind, wc *verbs.WorkCompletion) *verbs.WorkCompletion {
	w := *wc
	switch kind {
	case OpRecv:
		w.Opcode = verbs.WCRecv
	case OpSend:
		w.Opcode = verbs.WCSend
	case OpWrite, OpCredit:
		w.Opcode = verbs.WCWrite
	case OpRead:
		w.Opcode = verbs.WCRead
	}
	return &w
}
