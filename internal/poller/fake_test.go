package poller

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// fakeCQ is a CQ in pure Go with the notification semantics of a real
// one: ReqNotify arms it, and the next completion pushed while it is
// armed sends exactly one event to its channel and disarms it.
// Completions already present when it is armed raise no event; that is
// the window a poller must close by polling after arming.
//
// Hooks run on the poller's goroutine at the adversarial moments, so a
// test can push a completion exactly there.
type fakeCQ struct {
	mu         sync.Mutex
	ring       []verbs.WorkCompletion
	head, tail uint64 // ring positions: next to poll, next to push
	armed      bool
	avail      atomic.Int64 // tail-head, for a lock-free empty check
	ch         waker        // nil: events go nowhere

	afterEmpty func() // after a Poll that found nothing
	beforeArm  func() // in ReqNotify, before arming
	afterArm   func() // in ReqNotify, after arming
	onAck      func() // in AckEvents

	pushed  atomic.Uint64
	polled  atomic.Uint64
	arms    atomic.Uint64
	fired   atomic.Uint64 // events sent
	acked   atomic.Int64
	pollErr error // returned by Poll once set (before Start)
	errAt   uint64
}

// waker is the channel side of a fake CQ.
type waker interface {
	verbs.CompChannel
	post(cq verbs.CQ) // called with the CQ's lock held
}

func newFakeCQ(size int, ch waker) *fakeCQ {
	n := 1
	for n < size {
		n <<= 1
	}
	q := &fakeCQ{ring: make([]verbs.WorkCompletion, n), ch: ch}
	switch c := ch.(type) {
	case *fakeChan:
		c.cq = q
	case *pipeChan:
		c.cq = q
	}
	return q
}

// push adds wcs if they fit and reports whether they did.
func (q *fakeCQ) push(wcs []verbs.WorkCompletion) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	size := uint64(len(q.ring))
	if q.tail-q.head+uint64(len(wcs)) > size {
		return false
	}
	for i := range wcs {
		q.ring[(q.tail+uint64(i))&(size-1)] = wcs[i]
	}
	q.tail += uint64(len(wcs))
	q.avail.Add(int64(len(wcs)))
	q.pushed.Add(uint64(len(wcs)))
	if q.armed && len(wcs) > 0 {
		q.armed = false
		q.fired.Add(1)
		if q.ch != nil {
			q.ch.post(q)
		}
	}
	return true
}

// push1 pushes one completion with the given WRID if there is room. The
// tests' CQs are larger than what they push, except where producers
// race; there the callers retry.
func (q *fakeCQ) push1(id uint64) bool {
	wc := [1]verbs.WorkCompletion{{WRID: id}}
	return q.push(wc[:])
}

func (q *fakeCQ) Poll(wc []verbs.WorkCompletion) (int, error) {
	if q.pollErr != nil && q.polled.Load() >= q.errAt {
		return 0, q.pollErr
	}
	if q.avail.Load() == 0 {
		if q.afterEmpty != nil {
			q.afterEmpty()
		}
		return 0, nil
	}
	// A hardware poll never sleeps: spin for the lock (producers hold it
	// for a copy). With a plain Lock the locked poller thread would park
	// whenever a producer holds the mutex, and the benchmarks would
	// measure that. Failing the poll instead would be wrong: the holder
	// may be a push that finds the ring full and raises no event.
	for !q.mu.TryLock() {
	}
	size := uint64(len(q.ring))
	n := min(uint64(len(wc)), q.tail-q.head)
	for i := uint64(0); i < n; i++ {
		wc[i] = q.ring[(q.head+i)&(size-1)]
	}
	q.head += n
	q.avail.Add(-int64(n))
	q.mu.Unlock()
	q.polled.Add(n)
	return int(n), nil
}

func (q *fakeCQ) ReqNotify(bool) error {
	if q.beforeArm != nil {
		q.beforeArm()
	}
	q.mu.Lock()
	q.armed = true
	q.mu.Unlock()
	q.arms.Add(1)
	if q.afterArm != nil {
		q.afterArm()
	}
	return nil
}

func (q *fakeCQ) AckEvents(n int) {
	q.acked.Add(int64(n))
	if q.onAck != nil {
		q.onAck()
	}
}

func (q *fakeCQ) Len() int     { return len(q.ring) }
func (q *fakeCQ) Close() error { return nil }

// fakeChan is a completion channel whose waiter parks on a Go channel.
// Every time GetEvent is about to block it checks the invariant that
// makes blocking safe: the CQ is armed and empty. Otherwise a completion
// sits in the CQ and no event will ever announce it (a lost wake-up).
type fakeChan struct {
	cq      *fakeCQ
	mu      sync.Mutex
	pending []verbs.CQ
	notify  chan struct{} // capacity 1
	closed  chan struct{}
	once    sync.Once

	delivered atomic.Uint64
	lost      atomic.Uint64 // blocks that broke the invariant
	blocked   chan struct{} // if not nil, gets a token each time GetEvent blocks
	// wakeDelay is how long a wait that its context ended takes to
	// return: a dear wake-up, as under emulation.
	wakeDelay time.Duration
}

func newFakeChan() *fakeChan {
	return &fakeChan{notify: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (c *fakeChan) post(cq verbs.CQ) {
	c.mu.Lock()
	c.pending = append(c.pending, cq)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *fakeChan) GetEvent(ctx context.Context) (verbs.CQ, error) {
	for {
		select {
		case <-c.closed:
			return nil, verbs.ErrClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Lock order: CQ, then channel (push posts with the CQ locked).
		if c.cq != nil {
			c.cq.mu.Lock()
		}
		c.mu.Lock()
		if len(c.pending) > 0 {
			cq := c.pending[0]
			n := copy(c.pending, c.pending[1:]) // keeps the array: no allocation per event
			c.pending[n] = nil
			c.pending = c.pending[:n]
			c.mu.Unlock()
			if c.cq != nil {
				c.cq.mu.Unlock()
			}
			c.delivered.Add(1)
			return cq, nil
		}
		if c.cq != nil && !(c.cq.armed && c.cq.tail == c.cq.head) {
			c.lost.Add(1)
		}
		c.mu.Unlock()
		if c.cq != nil {
			c.cq.mu.Unlock()
		}
		if c.blocked != nil {
			select {
			case c.blocked <- struct{}{}:
			default:
			}
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			time.Sleep(c.wakeDelay) // the stimulus, not a synchronisation
		case <-c.closed:
		}
	}
}

func (c *fakeChan) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// pipeChan is a completion channel that wakes its waiter the way the
// verbs provider does: one byte per event on a non-blocking pipe, waited
// for through Go's netpoller, with ctx mapped onto a read deadline.
type pipeChan struct {
	r, w *os.File
	rc   syscall.RawConn
	wfd  int
	cq   verbs.CQ

	mu  sync.Mutex
	gen uint64
}

func newPipeChan() (*pipeChan, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	rc, err := r.SyscallConn()
	if err != nil {
		return nil, err
	}
	var wfd int
	wrc, err := w.SyscallConn()
	if err != nil {
		return nil, err
	}
	wrc.Control(func(fd uintptr) { wfd = int(fd) })
	return &pipeChan{r: r, w: w, rc: rc, wfd: wfd}, nil
}

func (c *pipeChan) post(verbs.CQ) {
	b := [1]byte{1}
	for {
		_, err := syscall.Write(c.wfd, b[:])
		if err != syscall.EINTR {
			return
		}
	}
}

var longAgo = time.Unix(1, 0)

func (c *pipeChan) GetEvent(ctx context.Context) (verbs.CQ, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.gen++
		gen := c.gen
		c.r.SetReadDeadline(time.Time{})
		c.mu.Unlock()
		stop := context.AfterFunc(ctx, func() {
			c.mu.Lock()
			if c.gen == gen {
				c.r.SetReadDeadline(longAgo)
			}
			c.mu.Unlock()
		})
		var b [1]byte
		var rerr error
		err := c.rc.Read(func(fd uintptr) bool {
			_, e := syscall.Read(int(fd), b[:])
			if e == syscall.EAGAIN {
				return false
			}
			rerr = e
			return true
		})
		stop()
		c.mu.Lock()
		c.gen++
		c.mu.Unlock()
		switch {
		case err == nil && rerr == nil:
			return c.cq, nil
		case err == nil:
			return nil, rerr
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue // ctx ended (checked above) or a stale deadline
		case errors.Is(err, os.ErrClosed):
			return nil, verbs.ErrClosed
		}
		return nil, err
	}
}

func (c *pipeChan) Close() error {
	c.w.Close()
	return c.r.Close()
}
