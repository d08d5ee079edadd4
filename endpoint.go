package rdma

import (
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// endpoint is a Conn as its engine sees it (internal/engine): the
// completions of its WRs and its shared receives come to Endpoint's
// methods, and its shared receive queue gives it credits through
// Grantee's. A type of its own, so that these methods stay out of Conn's
// API.
type endpoint conn

func (c *conn) ep() *endpoint { return (*endpoint)(c) }

// Complete hands the completion of a WR the connection posted to what
// posted it. It runs on a poller.
func (e *endpoint) Complete(wc *verbs.WorkCompletion) { (*conn)(e).onCompletion(wc) }

// Received hands a message that took a receive of the SRQ on the
// connection's QP to its receive side. It runs on a poller.
func (e *endpoint) Received(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	c := (*conn)(e)
	if !c.holdForVerdict(nil, pb, wc) {
		c.rq.OnSharedRecv(pb, wc)
	}
}

// Fail ends the connection: its poller stopped or its port went down.
func (e *endpoint) Fail(err error) { (*conn)(e).fail(err) }

// Failed reports whether the connection has failed.
func (e *endpoint) Failed() bool { return (*conn)(e).life.Err() != nil }

// The send queue's owner (rc.Owner).

// CutOff fails the connection for err and ends its control channel.
func (e *endpoint) CutOff(err error) { (*conn)(e).cutOff(err) }

// ProtocolErr cuts off a peer that broke the control protocol.
func (e *endpoint) ProtocolErr(format string, args ...any) { (*conn)(e).protocolErr(format, args...) }

// FailedRecv counts a failed receive and returns its error.
func (e *endpoint) FailedRecv(wc *verbs.WorkCompletion) error {
	c := (*conn)(e)
	c.st.recvFailed(wc.Status, wc.Status == verbs.WCWRFlushErr && c.life.Orderly())
	return e.RecvErr(wc)
}

// RecvErr is the error a failed completion gives the Recvs waiting.
func (e *endpoint) RecvErr(wc *verbs.WorkCompletion) error {
	return (*conn)(e).completionErr(postedWC(rc.OpRecv, wc))
}

// Dispatch has the engine's workers run the connection's RecvHandler.
func (e *endpoint) Dispatch() { e.eng.Dispatch(e) }

// Later runs job on the connection's control worker.
func (e *endpoint) Later(job func()) { e.ctl.Later(job) }

// WriteControl sends a control frame to the peer.
func (e *endpoint) WriteControl(typ byte, p []byte) error { return e.ctl.Write(typ, p) }

// Finish resolves a send-side op a completion covered.
func (e *endpoint) Finish(o *rc.Op, err error) { (*conn)(e).finish(o, err) }
