package rdma

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// CompletionError is an operation the device completed with an error:
// a failed work completion. It is in the chain of the error of the
// operation's Future, and of the errors of the connection it failed.
//
// Status is the completion's status as libibverbs names it, for example
// "REM_ACCESS_ERR" (the peer's memory refused the access: a wrong rkey,
// range or rights), "RETRY_EXC_ERR" (the transport gave up on the peer)
// or "WR_FLUSH_ERR" (the queue pair had failed before the operation ran).
// Op is the operation that was posted ("SEND", "RDMA_WRITE", "RECV",
// ...), as the library knows it, not as the device reported it (a failed
// completion's opcode is undefined on many devices). For an atomic it
// is as the device reported it. WRID is the work request's id and QPN its
// queue pair's number, for logs; VendorErr is the device's own code for
// the failure.
//
// errors.Is matches the sentinel of its status: ErrRemoteAccess,
// ErrRemoteOp, ErrRNRRetry, ErrRetryExceeded or ErrFlushed.
type CompletionError struct {
	Status    string
	Op        string
	WRID      uint64
	QPN       uint32
	VendorErr uint32

	wc verbs.WCError
}

// Error gives the status, the work request id, the queue pair, the
// opcode and the vendor error.
func (e *CompletionError) Error() string { return e.wc.Error() }

// Is matches the sentinel of e's status.
func (e *CompletionError) Is(target error) bool { return e.wc.Is(target) }

func completionError(wc *verbs.WorkCompletion) *CompletionError {
	e := &CompletionError{Status: wc.Status.String(), Op: wc.Opcode.String(), WRID: wc.WRID, QPN: wc.QPN, VendorErr: wc.VendorErr}
	e.wc = verbs.WCError{Status: wc.Status, Opcode: wc.Opcode, WRID: wc.WRID, VendorErr: wc.VendorErr, QPN: wc.QPN}
	return e
}

// postedWC is wc with the opcode of what was posted under its wr_id
// (kind), for a failed completion: the opcode field of a failed (a
// flushed) completion is undefined on many providers, and soft's reads
// SEND for every receive. The kind does not tell the two atomics apart:
// theirs stays as reported.
func postedWC(kind rc.OpKind, wc *verbs.WorkCompletion) *verbs.WorkCompletion {
	w := *wc
	switch kind {
	case rc.OpRecv:
		w.Opcode = verbs.WCRecv
	case rc.OpSend:
		w.Opcode = verbs.WCSend
	case rc.OpWrite, rc.OpCredit:
		w.Opcode = verbs.WCWrite
	case rc.OpRead:
		w.Opcode = verbs.WCRead
	}
	return &w
}

// CompletionStatus is a work completion's status, numbered as libibverbs
// numbers enum ibv_wc_status. It indexes ConnStats.SendFailures and
// RecvFailures; its String is the name CompletionError.Status carries.
type CompletionStatus uint8

// The completion statuses, in libibverbs' order. A status a device
// reports beyond these is counted as StatusGeneralErr.
// CompletionStatuses is their number: the length of the arrays they
// index.
const (
	StatusSuccess CompletionStatus = iota
	StatusLocLenErr
	StatusLocQPOpErr
	StatusLocEECOpErr
	StatusLocProtErr
	StatusWRFlushErr
	StatusMWBindErr
	StatusBadRespErr
	StatusLocAccessErr
	StatusRemInvReqErr
	StatusRemAccessErr
	StatusRemOpErr
	StatusRetryExcErr
	StatusRNRRetryExcErr
	StatusLocRDDViolErr
	StatusRemInvRdReqErr
	StatusRemAbortErr
	StatusInvEECNErr
	StatusInvEECStateErr
	StatusFatalErr
	StatusRespTimeoutErr
	StatusGeneralErr
	CompletionStatuses
)

// String is the status as libibverbs names it, for example
// "REM_ACCESS_ERR".
func (s CompletionStatus) String() string { return verbs.WCStatus(s).String() }

// completionStatus is st as a CompletionStatus, an unknown one counted as
// a general error.
func completionStatus(st verbs.WCStatus) CompletionStatus {
	if st >= verbs.WCStatus(CompletionStatuses) {
		return StatusGeneralErr
	}
	return CompletionStatus(st)
}

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

// onSendDone resolves a send-side completion and every unsignaled WR it
// covers. It runs on a poller.
func (c *conn) onSendDone(o *rc.Op, wc *verbs.WorkCompletion) {
	k := c.sq.TakeCovered(wc.WRID)
	if k > 1 {
		c.st.completions.Add(uint64(k - 1))
	}
	c.st.completed(wc.Status, wc.Status == verbs.WCWRFlushErr && c.life.Orderly())
	var err error
	if wc.Status != verbs.WCSuccess {
		err = c.completionErr(postedWC(o.Kind, wc))
	}
	if err != nil {
		// Fail first: whoever sees this future resolve must also see a
		// failed connection.
		c.fail(err)
	}
	c.finish(o, err)
	c.sq.Settle(k)
}

// completionErr is the error of a failed completion; it keeps the
// *CompletionError for errors.As, except after the peer's close.
//   - Once the peer's orderly close was heard, whatever fails is that
//     close's doing (the QP went to the error state, the peer tore its
//     side down): the error is the close's own (peerClosedErr), the same
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
func (c *conn) completionErr(wc *verbs.WorkCompletion) error {
	if c.life.CloseHeard() {
		return c.life.PeerClosedErr()
	}
	var err error = completionError(wc)
	switch {
	case wc.Status == verbs.WCWRFlushErr:
		cause := c.life.Err()
		if cause == nil && c.cm != nil {
			cause = c.life.PeerClosedErr()
		} else if cause == nil {
			cause = c.life.PeerLostErr()
		}
		return fmt.Errorf("%w (%w)", cause, err)
	case wc.Status == verbs.WCRetryExcErr, wc.Status == verbs.WCRemOpErr, wc.Status == verbs.WCRemAbortErr,
		c.life.PeerClosed():
		c.life.SetPeerClosed()
		// The peer's end may carry its reason (an abort's): keep it.
		cause := c.life.Err()
		if cause == nil || !(errors.Is(cause, ErrPeerClosed) || errors.Is(cause, ErrPeerLost)) {
			cause = c.life.PeerLostErr()
		}
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return fmt.Errorf("rdma: peer %v: %w", c.remote, err)
}

// observeLatency counts the latency of a sampled op that succeeded.
func (c *conn) observeLatency(o *rc.Op) {
	if o.Start != 0 {
		c.st.latency.observe(rc.Nanotime() - o.Start)
	}
}

// finish resolves a send-side op: a signaled one (or any that failed)
// resolves its future; its buffer and credit go back.
func (c *conn) finish(o *rc.Op, err error) {
	if err == nil {
		c.observeLatency(o)
	}
	if o.Signaled || o.Covered || err != nil {
		var old uint64
		if err == nil && o.Kind == rc.OpAtomic {
			old = *(*uint64)(unsafe.Pointer(&o.Buf.Bytes()[0]))
		}
		o.Resolve(err, o.N, old)
	}
	o.DropBuf()
	c.life.OpDone()
}
