package rdma

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/leak"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/rc"
)

// Future is the result of one operation. It resolves exactly once, when
// the completion that covers the operation arrives or the connection
// fails. Waiting on it never cancels the operation: a Wait that returns
// early because its context ended leaves the operation tracked, and the
// buffers it uses stay out of the pool until the device is done with them.
//
// A loop that issues many operations can Release each future once it is
// done with it, so that the next operation reuses it and allocates
// nothing. A released future must not be used: until an operation
// reuses it, Wait and Err return ErrFutureReleased, Done is closed,
// Resolved is true, the other methods return zero values and Release
// does nothing; once reused, it is that operation's future, and a stale
// pointer to it sees the other operation's result. To find such uses,
// run the program with GORDMA_DEBUG=futures in its environment: released
// futures are then never reused (every operation allocates its own) and
// each use after Release is reported on standard error with the stack
// of the use and the stack of the Release.
type Future struct {
	state atomic.Uint32  // futurePending, futureResolved or futureReleased
	drv   *poller.Poller // set when the connection's poller is Busy: Wait drives it
	recv  *rc.Receiver   // a Recv waiting for a message, which Cancel may withdraw

	mu     sync.Mutex
	gen    uint32        // counts reuses (Release); an op resolves only its own (resolveOp)
	done   chan struct{} // made on demand by Done
	waiter chan struct{} // a pooled wake-up channel of one blocked Wait

	err  error
	n    int     // bytes moved or received
	imm  uint32  // immediate value of a receive
	has  bool    // imm is valid
	buf  *Buffer // received buffer (points at rbuf)
	rbuf Buffer  // the received buffer's handle, kept here to save an allocation
	old  uint64  // old value of an atomic

	// reusable futures go back to futurePool at Release: those of one
	// operation. A Batch's future is shared by its ops' records, and is
	// not.
	reusable bool
	// cell mirrors rbuf's buffer for the safety net of a reused future
	// (Release): the cleanup armed once, on the future, with cell as
	// its argument, so that a reused receive arms none.
	cell *atomic.Pointer[pool.Buffer]
}

// A future's states. A released future stays released until newFuture
// hands it to an operation: with GORDMA_DEBUG=futures, for ever.
const (
	futurePending = iota
	futureResolved
	futureReleased
)

// ErrFutureReleased: the Future was released (Release); its result is
// gone. A released future's Wait and Err return it.
var ErrFutureReleased = errors.New("future already released")

// futurePool holds released futures (Release) for the next operations.
var futurePool = sync.Pool{New: func() any { return &Future{reusable: true} }}

// newFuture is a pending future of one operation, reused if one was
// released.
func newFuture(drv *poller.Poller) *Future {
	f := futurePool.Get().(*Future)
	f.reuse(drv)
	return f
}

// reuse makes a new or released future pending for its operation. Its
// err stays until it resolves: nothing reads it before. The state's
// store is a plain one, as nothing else may hold a future the pool
// handed out (code that does uses it after Release, and the race
// detector reports it when that use is concurrent), and it keeps
// newFuture inlined.
func (f *Future) reuse(drv *poller.Poller) {
	f.drv = drv
	f.state = atomic.Uint32{}
}

// closedChan is the Done channel of futures that resolved before anyone
// asked for one, so resolved futures cost no channel.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func newResolved(err error) *Future {
	f := newFuture(nil)
	f.err = err
	f.state.Store(futureResolved)
	return f
}

// Release gives a resolved future back to be reused by a later
// operation, so that a loop of operations allocates nothing. It is
// optional: a future that is not released is collected as usual. After
// Release neither f nor the Buffer it delivered may be used, as after
// a Close (see Future for what a use gets, and how to find one).
// Release does nothing to a future that has not resolved, to a Batch's
// future, to one whose Buffer is still held (Release the Buffer first),
// and to one released already.
func (f *Future) Release() {
	if f == nil {
		return
	}
	if st := f.state.Load(); st != futureResolved || !f.reusable {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		return
	}
	f.mu.Lock() // resolve may still be waking a waiter
	defer f.mu.Unlock()
	if f.rbuf.p.Load() != nil {
		return
	}
	if d := futureDebug.Load(); d != nil {
		// Never reused: the future stays released, and remembers
		// where, for the report of a later use.
		f.releaseLocked(&releasedError{at: callers(2)})
		return
	}
	f.releaseLocked(ErrFutureReleased)
	futurePool.Put(f)
}

// releaseLocked clears a resolved future's results and makes it
// released, its error why; the gen bump keeps the records of its
// operation from resolving it once it is reused (resolveOp). Caller
// holds f.mu.
func (f *Future) releaseLocked(why error) {
	if f.cell == nil {
		f.cell = new(atomic.Pointer[pool.Buffer])
		runtime.AddCleanup(f, collectedCell, f.cell)
	}
	f.gen++
	f.drv, f.recv, f.done, f.waiter = nil, nil, nil, nil
	f.err, f.n, f.imm, f.has, f.buf, f.old = why, 0, 0, false, nil, 0
	f.rbuf = Buffer{cell: f.cell}
	f.state.Store(futureReleased)
}

// collectedCell is the safety net of a reused future's received buffer:
// the future became unreachable while its buffer was held.
func collectedCell(cell *atomic.Pointer[pool.Buffer]) {
	if pb := cell.Swap(nil); pb != nil {
		leak.Collected(pb)
		_ = pb.Release()
	}
}

// Done is closed when the future resolves.
//
// With a Busy poller, Done wakes the poller, since whoever selects on the
// channel does not poll the CQ: to look without blocking, use Resolved,
// and to block, Wait, which polls from the calling goroutine.
func (f *Future) Done() <-chan struct{} {
	if st := f.state.Load(); st != futurePending {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		return closedChan
	}
	if f.drv != nil {
		f.drv.Resume() // whoever selects on the channel does not poll
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state.Load() != futurePending {
		return closedChan
	}
	if f.done == nil {
		f.done = make(chan struct{})
	}
	return f.done
}

// Wait waits for the future to resolve and returns its error. When ctx
// ends first it returns ctx.Err() at once; the operation goes on. A nil
// ctx is context.Background(): Wait waits as long as the operation takes.
//
// With a Busy poller (WithPollMode(PollBusy)) Wait polls the CQ from
// the calling goroutine until the future resolves, run to completion, as
// perftest's loops do: no thread has to wake it. One goroutine polls at a
// time; other Waits block as usual.
func (f *Future) Wait(ctx context.Context) error {
	if st := f.state.Load(); st != futurePending {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		return f.err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if f.drv != nil {
		if f.drv.Drive(ctx, &f.state) {
			if f.state.Load() == futureResolved {
				return f.err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		f.drv.WaitingAdd(1)
		defer f.drv.WaitingAdd(-1)
	}
	// Borrow a wake-up channel rather than making Done's: a future is
	// waited on once, typically, and this keeps Wait free of allocations.
	w := wakePool.Get().(chan struct{})
	f.mu.Lock()
	if f.state.Load() != futurePending {
		f.mu.Unlock()
		wakePool.Put(w)
		return f.err
	}
	if f.waiter != nil { // another goroutine waits already
		f.mu.Unlock()
		wakePool.Put(w)
		select {
		case <-f.Done():
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.waiter = w
	f.mu.Unlock()
	select {
	case <-w:
		wakePool.Put(w)
		return f.err
	case <-ctx.Done():
		f.mu.Lock()
		woken := f.waiter == nil // resolve took it and sent (or sends) a token
		f.waiter = nil
		f.mu.Unlock()
		if woken {
			<-w // drain, so the pooled channel is empty
		}
		wakePool.Put(w)
		return ctx.Err()
	}
}

// Cancel withdraws a Recv that has not matched a message yet: it takes
// no message from then on, and the future resolves with an error
// wrapping context.Canceled. Cancel reports whether it withdrew the
// Recv. It returns false, and changes nothing, when the Recv has matched
// a message already (the future then resolves, if it has not yet, with
// that message: take and Release its Buffer) and for every other
// operation: a posted work request cannot be withdrawn.
//
// A Wait that returns because its context ended does not withdraw the
// Recv; call Cancel then, or the Recv takes the next message:
//
//	f := c.Recv()
//	if err := f.Wait(ctx); err != nil && !f.Cancel() {
//		f.Wait(context.Background()) // matched as ctx ended: the message is in f
//	}
func (f *Future) Cancel() bool {
	if st := f.state.Load(); st != futurePending {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		return false
	}
	if f.recv == nil {
		return false
	}
	return f.recv.Withdraw((*recvFuture)(f))
}

// wakePool holds one-slot channels for Wait.
var wakePool = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

// Resolved reports whether the future has resolved, without blocking.
func (f *Future) Resolved() bool {
	st := f.state.Load()
	if st == futureReleased {
		f.usedAfterRelease()
	}
	return st != futurePending
}

// Err is the operation's error once resolved, and nil before.
func (f *Future) Err() error {
	if st := f.state.Load(); st != futurePending {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		return f.err
	}
	return nil
}

// Len is the number of bytes the operation moved (for a receive: the
// message length). Valid once resolved.
func (f *Future) Len() int {
	if st := f.state.Load(); st != futurePending {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		return f.n
	}
	return 0
}

// Imm is the immediate value of a receive that carried one; ok is false
// otherwise.
func (f *Future) Imm() (imm uint32, ok bool) {
	if st := f.state.Load(); st != futurePending {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		return f.imm, f.has
	}
	return 0, false
}

// Buffer is the buffer a receive delivered into. The caller owns it and
// must Release it. Nil for other operations and before resolution.
func (f *Future) Buffer() *Buffer {
	if st := f.state.Load(); st != futurePending {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		if f.buf != nil && leak.Enabled() {
			// Tests: blame a leak on whoever took the buffer, not
			// on the poller that delivered it.
			if pb := f.buf.pb(); pb != nil {
				leak.Claim(pb, 1)
			}
		}
		return f.buf
	}
	return nil
}

// Old is the value the remote word held before an atomic.
func (f *Future) Old() uint64 {
	if st := f.state.Load(); st != futurePending {
		if st == futureReleased {
			f.usedAfterRelease()
		}
		return f.old
	}
	return 0
}

// resolve sets the results and wakes waiters. Only the first call counts.
func (f *Future) resolve(err error, n int, imm uint32, hasImm bool, pb *pool.Buffer, old uint64) bool {
	f.mu.Lock()
	return f.resolveLocked(err, n, imm, hasImm, pb, old)
}

// opFuture is a Future as an operation's record sees it (rc.Op.Fut): a
// type of its own, so that ResolveOp stays out of Future's API.
type opFuture Future

// ResolveOp resolves the future, unless it was released and reused
// since the operation was issued (gen is its reuse count then).
func (of *opFuture) ResolveOp(gen uint32, err error, n int, old uint64) {
	f := (*Future)(of)
	f.mu.Lock()
	if f.gen != gen {
		f.mu.Unlock()
		return
	}
	f.resolveLocked(err, n, 0, false, nil, old)
}

// resolveLocked is resolve with f.mu held; it unlocks it.
func (f *Future) resolveLocked(err error, n int, imm uint32, hasImm bool, pb *pool.Buffer, old uint64) bool {
	if f.state.Load() != futurePending {
		f.mu.Unlock()
		return false
	}
	f.err, f.n, f.imm, f.has, f.old = err, n, imm, hasImm, old
	if pb != nil {
		f.rbuf.own(pb) // an interior pointer: AddCleanup allows it
		f.buf = &f.rbuf
	}
	f.state.Store(futureResolved)
	if f.done != nil {
		close(f.done)
	}
	if f.waiter != nil {
		f.waiter <- struct{}{} // one slot, never full: the waiter drains it
		f.waiter = nil
	}
	f.mu.Unlock()
	return true
}
