package soft

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/verbs"
)

// cq is a completion queue: a ring of at most cqe entries. It starts
// small and doubles when full, so a CQ sized for thousands of
// connections costs the completions its poller has yet to take, not its
// depth. When it holds cqe a new completion is dropped, as hardware does,
// and the QPs on the CQ go to ERR with an EventCQErr.
type cq struct {
	lt  verbs.Lifetime
	ctx *devContext
	ch  *compChannel

	// avail mirrors n and closed is set by Close, so that polling an
	// empty CQ (what a spinning poller mostly does) only reads memory
	// and takes no lock that the goroutines adding completions need.
	avail  atomic.Int32
	closed atomic.Bool

	mu     sync.Mutex
	cqe    int // the most entries the ring holds
	ring   []verbs.WorkCompletion
	owner  []*qp // of each ring entry, the QP whose unpolled counts it (push)
	head   int
	n      int
	armed  uint8 // 0 not armed, armAny, armSolicited
	events int   // events delivered and not acknowledged
	qps    map[*qp]int
	ovf    bool // overrun reported and not yet handled
}

const (
	armAny       = 1
	armSolicited = 2
)

// firstCQEntries is the size of a CQ's ring at its start.
const firstCQEntries = 64

func (c *cq) Len() int { return c.cqe }

// grow doubles the ring, up to cqe, keeping its entries in order.
// Caller holds mu.
func (c *cq) grow() {
	n := min(2*len(c.ring), c.cqe)
	ring, owner := make([]verbs.WorkCompletion, n), make([]*qp, n)
	for i := range c.n {
		j := (c.head + i) % len(c.ring)
		ring[i], owner[i] = c.ring[j], c.owner[j]
	}
	c.ring, c.owner, c.head = ring, owner, 0
}

func (c *cq) Poll(wc []verbs.WorkCompletion) (int, error) {
	if c.avail.Load() == 0 || len(wc) == 0 {
		if c.closed.Load() {
			return 0, errClosed("poll cq")
		}
		return 0, nil
	}
	if !c.lt.Enter() {
		return 0, errClosed("poll cq")
	}
	c.mu.Lock()
	k := min(len(wc), c.n)
	for i := 0; i < k; i++ {
		wc[i] = c.ring[c.head]
		if q := c.owner[c.head]; q != nil {
			q.unpolled.Add(-1)
			c.owner[c.head] = nil
		}
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
	}
	c.n -= k
	c.avail.Store(int32(c.n))
	c.mu.Unlock()
	c.lt.Exit()
	return k, nil
}

func (c *cq) ReqNotify(solicitedOnly bool) error {
	if !c.lt.Enter() {
		return errClosed("req notify cq")
	}
	defer c.lt.Exit()
	if c.ch == nil {
		return nil
	}
	c.mu.Lock()
	if solicitedOnly {
		if c.armed != armAny {
			c.armed = armSolicited
		}
	} else {
		c.armed = armAny
	}
	c.mu.Unlock()
	return nil
}

func (c *cq) AckEvents(n int) {
	c.mu.Lock()
	c.events = max(c.events-n, 0)
	c.mu.Unlock()
}

// push adds one completion. solicited marks a receive of a solicited
// message; errors always count as solicited for notification.
//
// events is where a connection reader collects the events of the frame
// it serves (qp.events), nil elsewhere: an event for a channel with a
// direct handler goes there, and the reader raises it at the frame's end
// (conn.raiseEvents), in its own goroutine, holding no lock.
func (c *cq) push(wc verbs.WorkCompletion, solicited bool, events *[]*cq) {
	c.pushOwned(wc, solicited, events, nil)
}

// pushOwned is push of a send completion of q, counted in q.unpolled
// until it is polled.
func (c *cq) pushOwned(wc verbs.WorkCompletion, solicited bool, events *[]*cq, q *qp) {
	c.mu.Lock()
	if c.n == len(c.ring) && len(c.ring) < c.cqe {
		c.grow()
	}
	if c.n == len(c.ring) {
		if !c.ovf {
			c.ovf = true
			overruns.mu.Lock()
			overruns.list = append(overruns.list, c)
			overruns.pending.Store(1)
			overruns.mu.Unlock()
		}
		c.mu.Unlock()
		return
	}
	i := c.head + c.n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = wc
	if q != nil {
		c.owner[i] = q
		q.unpolled.Add(1)
	}
	c.n++
	c.avail.Store(int32(c.n))
	notify := c.armed == armAny || (c.armed == armSolicited && (solicited || wc.Status != verbs.WCSuccess))
	if notify {
		c.armed = 0
	}
	c.mu.Unlock()
	if notify {
		if events != nil && c.ch.direct.Load() != nil {
			*events = append(*events, c)
			return
		}
		c.ch.post(c)
	}
}

// overrun handles a CQ that dropped a completion: every QP on it goes to
// ERR, and the Context reports EventCQErr.
func (c *cq) overrun() {
	c.mu.Lock()
	c.ovf = false
	var qpns []uint32
	for q := range c.qps {
		qpns = append(qpns, q.qpn)
	}
	c.mu.Unlock()
	c.ctx.event(verbs.EventCQErr, 0)
	for _, n := range qpns {
		if q := getQP(n); q != nil {
			q.mu.Lock()
			q.enterErr(errCQOverrun)
			q.mu.Unlock()
			q.refs.release()
		}
	}
}

func (c *cq) attach(q *qp) error {
	if err := c.lt.AddChild(); err != nil {
		return err
	}
	c.mu.Lock()
	c.qps[q]++
	c.mu.Unlock()
	return nil
}

func (c *cq) detach(q *qp) {
	c.mu.Lock()
	if c.qps[q]--; c.qps[q] <= 0 {
		delete(c.qps, q)
	}
	c.mu.Unlock()
	c.lt.DropChild()
}

func (c *cq) Close() error {
	return c.lt.Close(func() error {
		c.closed.Store(true)
		if c.ch != nil {
			c.ch.forget(c)
			c.ch.lt.DropChild()
		}
		c.ctx.lt.DropChild()
		return nil
	})
}

// compChannel delivers CQ events.
type compChannel struct {
	lt  verbs.Lifetime
	ctx *devContext

	// direct takes the events that connection readers raise, instead of
	// GetEvent (verbs.DirectChannel).
	direct atomic.Pointer[func(verbs.CQ)]

	mu   sync.Mutex
	q    []*cq
	wake chan struct{}
	done chan struct{}
}

// SetDirect makes f take the events that connection readers raise (see
// verbs.DirectChannel); nil removes it.
func (ch *compChannel) SetDirect(f func(verbs.CQ)) {
	if f == nil {
		ch.direct.Store(nil)
		return
	}
	ch.direct.Store(&f)
}

// directRunning counts the direct handlers running. While one runs, a
// PostSend leaves the network to the QP's worker (postsRemote): the
// handler runs in a connection reader, which must never block writing to
// a peer whose own reader may be blocked writing to it.
var directRunning atomic.Int32

// raise delivers the event of CQ c: to the channel's direct handler if it
// has one, else to GetEvent. Only connection readers call it, holding no
// lock.
func raise(c *cq) {
	if f := c.ch.direct.Load(); f != nil {
		directRunning.Add(1)
		(*f)(c)
		directRunning.Add(-1)
		return
	}
	c.ch.post(c)
}

func (ch *compChannel) post(c *cq) {
	ch.mu.Lock()
	ch.q = append(ch.q, c)
	ch.mu.Unlock()
	ch.signal()
}

func (ch *compChannel) signal() {
	select {
	case ch.wake <- struct{}{}:
	default:
	}
}

// forget drops the queued events of a CQ being destroyed.
func (ch *compChannel) forget(c *cq) {
	ch.mu.Lock()
	k := 0
	for _, x := range ch.q {
		if x != c {
			ch.q[k] = x
			k++
		}
	}
	clear(ch.q[k:])
	ch.q = ch.q[:k]
	ch.mu.Unlock()
}

func (ch *compChannel) GetEvent(ctx context.Context) (verbs.CQ, error) {
	for {
		if ch.lt.Closed() {
			return nil, errClosed("get cq event")
		}
		ch.mu.Lock()
		if len(ch.q) > 0 {
			c := ch.q[0]
			copy(ch.q, ch.q[1:])
			ch.q[len(ch.q)-1] = nil
			ch.q = ch.q[:len(ch.q)-1]
			more := len(ch.q) > 0
			c.mu.Lock()
			c.events++
			c.mu.Unlock()
			ch.mu.Unlock()
			if more {
				ch.signal()
			}
			return c, nil
		}
		ch.mu.Unlock()
		select {
		case <-ch.wake:
		case <-ch.done:
			return nil, errClosed("get cq event")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (ch *compChannel) Close() error {
	return ch.lt.Close(func() error {
		close(ch.done)
		ch.ctx.lt.DropChild()
		return nil
	})
}
