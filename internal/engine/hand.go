package engine

import (
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// SRQHand is a shared receive queue in a test's hand: the property tests
// of internal/rc, which drive the connections' real grants against a
// real SRQ. Its retry and decay timers only record that they were set
// or fired, its clock of recalls stands still between Tick calls (and
// that of recallAllAfter moves only as the test fires the timers), and
// the test fires the timers and hands over the completions. So every
// step of such a test runs on the test's goroutine, and a failure
// replays from its seed. Nothing else uses it.
type SRQHand struct {
	s                      *SRQ
	retryFired, decayFired atomic.Bool
	now                    time.Time // the SRQ's clock for recallAllAfter: moves only as the timers fire (under s.mu)
}

// handFarFuture is the last recall's time while recallGap has not passed.
var handFarFuture = time.Now().Add(1000 * time.Hour)

// Hand takes s's timers and clock.
func (s *SRQ) Hand() *SRQHand {
	h := &SRQHand{s: s}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hand = h
	s.retry.Stop()
	s.decay.Stop()
	s.retry = time.AfterFunc(time.Hour, func() { h.retryFired.Store(true) })
	s.retry.Stop()
	s.decay = time.AfterFunc(time.Hour, func() { h.decayFired.Store(true) })
	s.decay.Stop()
	return h
}

// Clock keeps time still: a recall that just happened holds the next
// one off until a Tick.
func (h *SRQHand) Clock() {
	h.s.mu.Lock()
	if !h.s.recallAt.IsZero() {
		h.s.recallAt = handFarFuture
	}
	h.s.mu.Unlock()
}

// Tick lets recallGap pass.
func (h *SRQHand) Tick() {
	h.s.mu.Lock()
	h.s.recallAt = time.Time{}
	h.s.mu.Unlock()
}

// Recalled makes as if a recall just went out.
func (h *SRQHand) Recalled() {
	h.s.mu.Lock()
	h.s.recallAt = handFarFuture
	h.s.mu.Unlock()
}

// RetryArmed reports whether the retry timer was set since it last
// fired, and disarms it: the caller fires it (FireRetry).
func (h *SRQHand) RetryArmed() bool {
	h.s.mu.Lock()
	armed := h.s.retry.Stop()
	h.s.mu.Unlock()
	return h.retryFired.Swap(false) || armed
}

// RetryFired reports whether the retry timer fired unseen.
func (h *SRQHand) RetryFired() bool { return h.retryFired.Load() }

// FireRetry runs what the retry timer runs, more than recallGap after
// it was set.
func (h *SRQHand) FireRetry() {
	h.Tick()
	h.s.mu.Lock()
	h.now = h.now.Add(srqRetry)
	h.s.mu.Unlock()
	h.s.refill(RefillRetry)
	h.Clock()
}

// DecayArmed reports whether the decay look is due.
func (h *SRQHand) DecayArmed() bool { return h.s.decayArmed.Load() }

// FireDecay runs the decay look, which the timer runs while it is armed.
func (h *SRQHand) FireDecay() {
	h.s.mu.Lock()
	h.s.decay.Stop()
	h.now = h.now.Add(srqDecay)
	h.s.mu.Unlock()
	h.decayFired.Store(false)
	h.s.decayLook()
	h.Clock()
}

// Waiting is what c's record in the queue of waiters wants, and
// whether it has one.
func (h *SRQHand) Waiting(c Grantee) (want int, ok bool) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if w := h.s.wq.byConn[c]; w != nil {
		return w.want, true
	}
	return 0, false
}

// Refill refills the queue as for cause.
func (h *SRQHand) Refill(cause int) { h.s.refill(cause) }

// Withdrawing is the receives posted but reserved for a withdrawal.
func (h *SRQHand) Withdrawing() int64 { return h.s.withdrawing.Load() }

// Stop stops the timers.
func (h *SRQHand) Stop() {
	h.s.mu.Lock()
	h.s.retry.Stop()
	h.s.decay.Stop()
	h.s.mu.Unlock()
}

// Completions hands a batch of completions of u's CQ to the endpoints,
// as u's poller does.
func (h *SRQHand) Completions(e *Engine, u *Unit, wcs []verbs.WorkCompletion) { e.completions(u, wcs) }
