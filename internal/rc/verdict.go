package rc

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// When a WR fails because the peer's queue pair failed under it (the
// transport gave up: RETRY_EXC_ERR, REM_OP_ERR, REM_ABORT_ERR), the
// completion does not say why the peer went: it may have aborted, telling
// its reason on the control channel, closed in order, or died. The
// control channel knows: an abort or close frame, or the end of the
// socket that a dead process's kernel closes. The two race: the peer's
// abort moves its queue pair to the error state, and the NAK of a message
// in flight can reach this side's poller before the abort frame reaches
// its control reader. So the completions of such a connection wait, held
// in order, until the control channel has had its word or verdictBound
// has passed (a peer whose host or network went says nothing): then the
// connection fails with the channel's verdict, ErrPeerLost without one,
// and the held completions are handled as they came, with that error.
//
// A remote access or invalid-request error (REM_ACCESS_ERR,
// REM_INV_REQ_ERR) is usually this side's doing (a wrong rkey, a region
// revoked), but a killed peer's kernel gives the same answer: it
// deregisters the process's memory before it destroys its queue pair and
// closes its sockets, so a WRITE in flight finds the rkey gone. Such a
// completion waits too, and asks the peer whether it lives (CtrlPing): a
// live peer's answer (CtrlPong, one round trip) lets the completions go
// with their own error; the socket's end says the peer died (ErrPeerLost,
// the completion's error in the chain).

// verdictBound is how long failed completions wait for the control
// channel's word on why the peer went.
const verdictBound = 2 * time.Second

// verdict holds a connection's completions while it waits for the
// control channel's word.
type verdict struct {
	holding atomic.Bool // completions wait in held
	mu      sync.Mutex
	held    []heldWC
	lost    bool          // a held completion said the peer's queue pair failed: a pong does not end the wait
	alive   chan struct{} // closed when the peer answers the ping of this wait
}

// heldWC is a completion waiting for the verdict: of an op of the
// connection's table, or of a receive of the SRQ (pb).
type heldWC struct {
	o  Op
	pb *pool.Buffer
	wc verbs.WorkCompletion
}

// peerQPFailed reports whether a completion says the peer's queue pair
// failed under the WR.
func peerQPFailed(st verbs.WCStatus) bool {
	return st == verbs.WCRetryExcErr || st == verbs.WCRemOpErr || st == verbs.WCRemAbortErr
}

// accessFailed reports whether a completion says the peer refused the
// access: this side's doing, or a peer whose memory died with it.
func accessFailed(st verbs.WCStatus) bool {
	return st == verbs.WCRemAccessErr || st == verbs.WCRemInvReqErr
}

// mayHold reports whether wc may have to wait for the verdict
// (holdForVerdict): it failed, or others wait. A completion that
// succeeded while none waits, the common case, goes its way at the cost
// of one atomic load.
func (v *verdict) mayHold(wc *verbs.WorkCompletion) bool {
	return wc.Status != verbs.WCSuccess || v.holding.Load()
}

// onPong takes the peer's answer to the ping of the wait under way, if
// any; an answer nobody asked for is dropped.
func (v *verdict) onPong() {
	v.mu.Lock()
	if v.alive != nil {
		close(v.alive)
		v.alive = nil
	}
	v.mu.Unlock()
}

// holdForVerdict keeps the completion of o (or of an SRQ receive, pb) for
// the verdict when the connection waits for one, or starts waiting when
// the completion says the peer's queue pair failed, or refused an
// access, and the control channel has not spoken yet. It reports whether
// it kept it. It runs on a poller.
func (c *Conn) holdForVerdict(o *Op, pb *pool.Buffer, wc *verbs.WorkCompletion) bool {
	if !c.vd.holding.Load() {
		if wc.Status == verbs.WCSuccess || !(peerQPFailed(wc.Status) || accessFailed(wc.Status)) || c.Ctl.Conn() == nil ||
			c.Life.Err() != nil || c.Life.CloseHeard() || !c.vd.holding.CompareAndSwap(false, true) {
			return false
		}
		alive := make(chan struct{})
		c.vd.mu.Lock()
		c.vd.alive, c.vd.lost = alive, false
		c.vd.mu.Unlock()
		c.Later(func() { c.Ctl.Write(CtrlPing, nil) })
		go c.awaitVerdict(alive)
	}
	c.vd.mu.Lock()
	defer c.vd.mu.Unlock()
	if !c.vd.holding.Load() {
		return false // the verdict came meanwhile: handle it now
	}
	if peerQPFailed(wc.Status) {
		c.vd.lost = true
	}
	h := heldWC{pb: pb, wc: *wc}
	if o != nil {
		h.o = *o
	}
	c.vd.held = append(c.vd.held, h)
	return true
}

// awaitVerdict waits for the control channel's word (alive closes when
// the peer answers the ping), fails the connection with it, and hands
// the held completions on in order.
func (c *Conn) awaitVerdict(alive chan struct{}) {
	t := time.NewTimer(verdictBound)
	defer t.Stop()
	lives := false
	for waiting := true; waiting; {
		select {
		case <-c.ctx.Done(): // failed: an abort's reason, the socket's end, a close here
		case <-c.Ctl.Done():
		case <-c.Ctl.Heard(): // the peer closed in order
		case <-t.C:
		case <-alive:
			// The peer lives: only refused accesses are held, and they
			// fail with their own error; a queue pair of the peer's
			// that failed still waits for the word or the bound.
			alive = nil
			c.vd.mu.Lock()
			lives = !c.vd.lost
			c.vd.mu.Unlock()
			if !lives {
				continue
			}
		}
		waiting = false
	}
	if !lives {
		if c.Life.CloseHeard() {
			c.Fail(c.Life.PeerClosedErr())
		}
		c.Fail(c.Life.PeerLostErr()) // nothing if it failed already
	}
	for {
		c.vd.mu.Lock()
		held := c.vd.held
		c.vd.held = nil
		if len(held) == 0 {
			c.vd.holding.Store(false)
			c.vd.alive = nil
			c.vd.mu.Unlock()
			return
		}
		c.vd.mu.Unlock()
		for i := range held {
			h := &held[i]
			if h.pb != nil {
				c.RQ.OnSharedRecv(h.pb, &h.wc)
			} else {
				c.complete(&h.o, &h.wc)
			}
		}
	}
}
