package rdma

import (
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// endpoint is a Conn as its engine sees it (internal/engine): the
// completions of its WRs and its shared receives come to Endpoint's
// methods, and its shared receive queue gives it credits through
// Grantee's. A type of its own, so that these methods stay out of Conn's
// API.
type endpoint Conn

func (c *Conn) ep() *endpoint { return (*endpoint)(c) }

// Complete hands the completion of a WR the connection posted to what
// posted it. It runs on a poller.
func (e *endpoint) Complete(wc *verbs.WorkCompletion) { (*Conn)(e).onCompletion(wc) }

// Received hands a message that took a receive of the SRQ on the
// connection's QP to its receive side. It runs on a poller.
func (e *endpoint) Received(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	c := (*Conn)(e)
	if !c.holdForVerdict(nil, pb, wc) {
		c.onSharedRecv(pb, wc)
	}
}

// Fail ends the connection: its poller stopped or its port went down.
func (e *endpoint) Fail(err error) { (*Conn)(e).fail(err) }

// CreditRoom is how many more credits the connection may give its peer.
func (e *endpoint) CreditRoom() int { return (*Conn)(e).creditRoom() }

// CreditCap is the most credits the connection may give at once.
func (e *endpoint) CreditCap() int { return e.cfg.rqDepth }

// Give records k credits given to the peer and tells it.
func (e *endpoint) Give(k int, ahead bool) {
	c := (*Conn)(e)
	if ahead && !c.cr.spare.Load() {
		c.cr.spare.Store(true)
	}
	c.cr.creditOut.Add(int64(k))
	if c.cr.recalled.Load() {
		c.cr.recalled.Store(false) // it may be recalled again
	}
	c.owe(k)
}

// CreditsOut is what the peer holds or used on messages not yet here.
func (e *endpoint) CreditsOut() int64 { return e.cr.creditOut.Load() }

// Spare reports whether the peer was given credits ahead of its asks.
func (e *endpoint) Spare() bool { return e.cr.spare.Load() }

// Recall asks the peer for the credits it cannot use.
func (e *endpoint) Recall() { (*Conn)(e).recall() }

// LookQuiet recalls the credits of a peer that holds some and had no
// message since the last look, and reports whether it holds any. A
// sender that went quiet may never read credits written into its word
// after its idle timer stopped (it looks when it sends), and they would
// keep receives posted for ever.
func (e *endpoint) LookQuiet() bool {
	c := (*Conn)(e)
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

// Failed reports whether the connection has failed.
func (e *endpoint) Failed() bool { return (*Conn)(e).err() != nil }
