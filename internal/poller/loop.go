package poller

import (
	"context"
	"errors"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The poller's goroutine owns these (no other goroutine touches them).
type loopState struct {
	empty    uint64 // empty polls not yet published to st.empty
	maxBatch int
	sched    schedProbe
	wakeCost int64 // the mean cost of a Kick's wake, ns (window.go)
}

// schedProbe reads the runtime's count of runnable goroutines and
// GOMAXPROCS. It is not safe for concurrent use: each spinner (the
// poller, the one driver) has its own.
type schedProbe [2]metrics.Sample

// What a schedProbe finds.
const (
	schedFree    = iota // no goroutine waits for a P
	schedCrowded        // some do
	schedBacklog        // backlogPerP or more per P do
)

// backlogPerP is how many runnable goroutines per P make a backlog. A
// few per P come and go in a queue depth 1 ping-pong (the peer a
// dispatch just woke, the provider's and the credits' goroutines: up to
// 7 on 2 Ps, BenchmarkPingPong over soft); 16 goroutines doing
// request/response on 2 Ps keep 15 or more waiting in a quarter of the
// probes (BenchmarkOversubscribed).
const backlogPerP = 4

// load says whether goroutines are waiting for a P: spinning on would
// keep one of them off the CPU. Reading the runtime's counters costs
// about 60-90 ns (it takes the scheduler's lock); spinners read them
// every clockEvery empty polls.
func (s *schedProbe) load() int {
	if s[0].Name == "" {
		s[0].Name = "/sched/goroutines/runnable:goroutines"
		s[1].Name = "/sched/gomaxprocs:threads"
	}
	metrics.Read(s[:])
	if s[0].Value.Kind() != metrics.KindUint64 || s[0].Value.Uint64() == 0 {
		return schedFree
	}
	if s[1].Value.Kind() == metrics.KindUint64 && s[0].Value.Uint64() >= backlogPerP*s[1].Value.Uint64() {
		return schedBacklog
	}
	return schedCrowded
}

// crowdHold is how long a Busy poller behaves as an Adaptive one, and its
// waiters do not drive, after a spinner last saw a backlog of goroutines
// waiting for Ps. StandbyFor is the same trade: long enough to span many
// operations, short enough that a Busy poller is Busy again soon after
// the load has gone.
const crowdHold = time.Millisecond

// crowd probes the scheduler with s, the caller's probe, and reports
// whether goroutines wait for a P. A backlog starts, or prolongs, the
// hold (crowdHold).
func (p *Poller) crowd(s *schedProbe) bool {
	switch s.load() {
	case schedFree:
		return false
	case schedBacklog:
		p.st.backlogs.Add(1)
		p.crowdAt.Store(nanotime())
	}
	return true
}

// held says whether a backlog was seen within crowdHold. Once the hold
// has passed, the first to see it clears it, so that Drive does not read
// the clock when there was no backlog.
func (p *Poller) held() bool {
	at := p.crowdAt.Load()
	if at == 0 {
		return false
	}
	if nanotime()-at < p.holdFor {
		return true
	}
	p.crowdAt.CompareAndSwap(at, 0)
	return false
}

// epoch is the origin of the spin clock: time.Since on a time with a
// monotonic reading costs one vDSO clock read.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// flushEvery is how many empty polls a spinning poller makes between
// publishing its empty-poll count.
const flushEvery = 1024

// clockEvery is how many empty polls an Adaptive poller makes between
// reading the clock (power of two).
const clockEvery = 16

// run is the poller's goroutine. started, for a locked poller, gets the
// outcome of locking and pinning the thread (nil on success).
func (p *Poller) run(started chan<- error) {
	var err error
	if p.cfg.locked() {
		runtime.LockOSThread()
		// A pinned thread stays locked, so it exits with the goroutine
		// rather than run other goroutines on the poller's CPUs.
		if len(p.cfg.CPUs) == 0 {
			defer runtime.UnlockOSThread()
		}
		p.tid.Store(int32(threadID()))
		if len(p.cfg.CPUs) > 0 {
			err = pinThread(p.cfg.CPUs)
		}
		started <- err
	}
	var ls loopState
	if err == nil {
		err = p.loop(&ls)
	}
	p.mu.Lock()
	p.ended.Store(true) // drivers stop polling: the CQ may go away now
	p.mu.Unlock()
	p.flush(&ls)
	if p.stop.Load() {
		err = nil // errors caused by Close tearing things down are no news
	}
	p.err = err
	close(p.done)
}

func (p *Poller) flush(ls *loopState) {
	if ls.empty != 0 {
		p.st.empty.Add(ls.empty)
		ls.empty = 0
	}
}

func (p *Poller) loop(ls *loopState) error {
	for !p.stop.Load() {
		var err error
		switch p.cfg.Mode {
		case Busy:
			if p.ch != nil && p.held() {
				// A backlog of goroutines: spin and park as an
				// Adaptive poller until it has gone (crowdHold).
				err = p.spin(ls, p.cfg.Spin.Nanoseconds())
				break
			}
			// spin returns nil when goroutines wait for a P (and the
			// poller has a channel to park on): then park, as an
			// Adaptive poller does, and spin again after the wake.
			if err = p.spin(ls, 0); err == nil && p.ch == nil {
				continue // without a channel it cannot park: spin on
			}
		case Adaptive:
			if takeSpinSlot() {
				w := p.window(ls)
				if w > p.spinMin {
					p.st.longSpins.Add(1)
				}
				err = p.spin(ls, w)
				spinners.Add(-1)
			} else {
				p.st.spinsDenied.Add(1)
				err = p.drain(ls)
			}
		case Event:
			err = p.drain(ls)
		}
		if err != nil || p.stop.Load() {
			return err
		}
		if err := p.park(ls); err != nil {
			return err
		}
	}
	return nil
}

// spinners counts the Adaptive pollers of the process that are spinning.
// At most maxSpinners spin at once; the others drain the CQ and park at
// once, as Event pollers do. Like the Go scheduler, which keeps at most
// half of its Ps spinning for work, this keeps pollers from taking the
// cores that the goroutines they wake need: on 2 cores, two pollers
// spinning beside a stream's writer, reader and transport took half the
// machine and cost a third of its throughput (see docs/poller.md).
var spinners atomic.Int32

// maxSpinners is GOMAXPROCS/2, at least 1.
func maxSpinners() int32 { return int32(max(1, runtime.GOMAXPROCS(0)/2)) }

// spinLimit is maxSpinners as of the last takeSpinSlot, for Kick, which
// must not take the scheduler's lock that GOMAXPROCS takes.
var spinLimit atomic.Int32

func init() { spinLimit.Store(maxSpinners()) }

// takeSpinSlot counts the caller among the spinners if there is room.
func takeSpinSlot() bool {
	limit := maxSpinners()
	spinLimit.Store(limit)
	for {
		n := spinners.Load()
		if n >= limit {
			return false
		}
		if spinners.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// spinPolls is how many times a spinning poller (or a driver) polls the
// CQ per call into the provider (verbs.PollSpin): the verbs provider then
// spins in C and pays one cgo call per spinPolls empty polls. 32 empty
// polls take about 1 µs on a NIC and some 10 µs under emulation; a
// completion ends the call at once.
const spinPolls = 32

// poll polls (up to spins times, until something comes) and hands what
// it got to the handler. It takes the poll lock, which it shares with
// drivers (drive.go) and with a channel's direct handling (direct).
func (p *Poller) poll(ls *loopState, spins int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, err := verbs.PollSpin(p.cq, p.wc, spins)
	if n > 0 {
		p.h.Completions(p.wc[:n:n])
		p.st.batches.Add(1)
		p.st.completions.Add(uint64(n))
		if n > ls.maxBatch {
			ls.maxBatch = n
			p.st.maxBatch.Store(uint64(n))
		}
	} else {
		ls.empty++
		if ls.empty >= flushEvery {
			p.flush(ls)
		}
	}
	return n, err
}

// spin polls until Close, or, when window > 0, until the CQ has stayed
// empty for window nanoseconds with no Kick in between.
//
// Goroutines that the handler readies (futures' waiters) go to this P's
// runnext slot, where no other P may take them for a while; so the first
// time the CQ is found empty after a burst of completions the poller
// yields once, and the waiters run at once (see docs/poller.md).
func (p *Poller) spin(ls *loopState, window int64) error {
	var idle int    // consecutive empty polls
	var since int64 // when the CQ was first seen empty
	every := p.yieldEvery()
	dirty := false // completions handled since the last yield
	for !p.stop.Load() {
		if window <= 0 && p.driving.Load() {
			p.waitDrivers()
			continue
		}
		n, err := p.poll(ls, spinPolls)
		if err != nil {
			return err
		}
		if n > 0 {
			idle = 0
			dirty = true
			continue
		}
		idle++
		switch {
		case dirty:
			dirty = false
			if !p.cfg.NoIdleYield {
				p.yield()
			}
		case every > 0 && idle%every == 0:
			p.yield()
		case idle%autoCheckEvery == 0:
			every = p.yieldEvery() // GOMAXPROCS may have changed
		}
		if window <= 0 {
			if p.ch != nil && idle%clockEvery == 0 && p.crowd(&ls.sched) {
				// More goroutines than cores: a Busy poller that
				// spun on would keep the goroutines that consume
				// its completions off the CPU (docs/history/performance.md).
				p.st.spinsCut.Add(1)
				return nil
			}
			continue
		}
		if idle == 1 {
			since = nanotime()
		} else if idle%clockEvery == 0 {
			if p.crowd(&ls.sched) {
				// The CPU is wanted: park now, and let an event
				// bring the next completion.
				p.st.spinsCut.Add(1)
				return nil
			}
			if nanotime()-since >= window {
				if p.kick.Swap(false) {
					since = nanotime()
					continue
				}
				return nil
			}
		}
	}
	return nil
}

// autoCheckEvery is how often (in empty polls) a spinning poller with the
// automatic YieldEvery re-reads GOMAXPROCS.
const autoCheckEvery = 1 << 16

// autoYieldEvery is the automatic YieldEvery when GOMAXPROCS is 1.
const autoYieldEvery = 1024

func (p *Poller) yieldEvery() int {
	switch {
	case p.cfg.YieldEvery > 0:
		return p.cfg.YieldEvery
	case p.cfg.YieldEvery < 0:
		return 0
	case runtime.GOMAXPROCS(0) == 1:
		return autoYieldEvery
	}
	return 0
}

func (p *Poller) yield() {
	p.st.yields.Add(1)
	runtime.Gosched()
}

// drain polls until a poll comes back short: the CQ was empty then.
func (p *Poller) drain(ls *loopState) error {
	for !p.stop.Load() {
		n, err := p.poll(ls, 1)
		if err != nil {
			return err
		}
		if n < len(p.wc) {
			return nil
		}
	}
	return nil
}

// park arms the CQ, polls once more, and waits for an event, a Kick or
// Close. It returns nil when the poller should go back to polling.
//
// The order is what loses nothing: a completion that arrives after the
// last empty poll but before ReqNotify raises no event, so the poll after
// ReqNotify must find it; one that arrives after ReqNotify raises an
// event. The event is acked at once (one event, one ack), and the CQ is
// re-armed only on the next park, after polling: GetEvent, AckEvents,
// poll, ReqNotify, poll again.
func (p *Poller) park(ls *loopState) error {
	if err := p.cq.ReqNotify(false); err != nil {
		return err
	}
	p.st.arms.Add(1)
	if !p.cfg.noRepoll {
		n, err := p.poll(ls, 1)
		if err != nil {
			return err
		}
		if n > 0 {
			p.st.repolled.Add(uint64(n))
			return nil
		}
	}
	// Take the wait's context before announcing the park: a Kick that
	// sees parked cancels this very context, never one made after it.
	ctx := p.waitCtx()
	p.kickAt.Store(0)
	p.parked.Store(true)
	if p.kick.Swap(false) {
		p.parked.Store(false)
		return nil
	}
	p.flush(ls)
	p.st.parks.Add(1)
	cq, err := p.ch.GetEvent(ctx)
	p.parked.Store(false)
	if err != nil {
		if p.stop.Load() || (ctx.Err() != nil && errors.Is(err, context.Canceled)) {
			p.kick.Store(false) // this wake served the Kick
			p.st.wakeups.Add(1)
			if at := p.kickAt.Swap(0); at != 0 && !p.stop.Load() && p.spinMax > p.spinMin {
				ls.wakeSample(nanotime() - at)
			}
			return nil
		}
		return err
	}
	if cq == nil { // a provider bug; treat it as a spurious wake-up
		p.st.wakeups.Add(1)
		return nil
	}
	cq.AckEvents(1)
	p.st.events.Add(1)
	if cq != p.cq {
		return ErrSharedChannel
	}
	return nil
}
