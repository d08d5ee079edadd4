package poller

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Run to completion (Busy mode only).
//
// A goroutine waiting for one completion is fastest when it polls the CQ
// itself: nothing has to wake it, and no second thread spins beside it.
// Handing a completion from a poller on a locked thread to a parked
// waiter costs 15-30 µs on the development machine (see the package
// doc); perftest's latency tests poll from the thread that waits.
//
// So in Busy mode a waiter may drive the poller: Drive polls the CQ and
// dispatches to the handler from the calling goroutine until its flag is
// set. One goroutine drives at a time; the poller's own goroutine stands
// by (blocked, using no CPU) while anyone drives, and resumes StandbyFor
// to twice that after the last driver left, or at once if goroutines wait in
// WaitingAdd. A completion that arrives when nobody drives is therefore
// polled within StandbyFor by the poller, or at once by the next driver.
//
// The poll lock serializes the handler: it is called by one goroutine at
// a time, whichever polls, as before.

// StandbyFor is how long a Busy poller stays blocked after the last
// driver left. A waiter that drives again within it (a ping-pong, a
// window of operations) costs the poller nothing; an idle connection gets
// its completions polled this late at worst.
const StandbyFor = time.Millisecond

// driveCheckEvery is how many polls a driver makes between looks at its
// context; yieldDriveEvery how many empty ones between yields (cheap: a
// driver is not locked to its thread), counted across drives. A yield
// lets other goroutines on its P run, and it starts a new scheduling
// tick: a goroutine that waits by driving seldom blocks, and one seen on
// the same tick for 10 ms while in a cgo call has its P retaken by the
// runtime's sysmon, which then polls every 20 µs for the next
// millisecond. In a ping-pong on rxe (2 vCPUs, TCG) that was half of the
// processes' context switches, 3,246 of 6,712 for 2,000 round trips,
// where perftest had 261 (test/perf/switches.sh); counted within one
// drive, a short drive per round trip never reached the count.
const (
	driveCheckEvery = 64
	yieldDriveEvery = 128
)

// Drive polls the CQ from the calling goroutine, dispatching every
// completion to the handler, until *flag is not zero, ctx ends, the
// poller stops, or goroutines wait for a P even after it yielded to them
// once (see "More goroutines than cores" in docs/poller.md). It reports whether it drove at all: it
// does not when the poller is not Busy, has stopped, is holding after a
// backlog, or another goroutine drives. Whenever *flag is still zero
// after Drive, the caller should block as it would otherwise (after
// WaitingAdd).
//
// The handler must not call Drive.
func (p *Poller) Drive(ctx context.Context, flag *atomic.Uint32) bool {
	if p.cfg.Mode != Busy || p.ended.Load() || (!p.cfg.noCrowdCut && p.held()) || !p.driving.CompareAndSwap(false, true) {
		return false
	}
	p.st.drives.Add(1)
	done := ctx.Done()
	yielded := false // the last probe found goroutines waiting for a P, and this one yielded
	for i := 1; flag.Load() == 0; i++ {
		if p.mu.TryLock() {
			if p.ended.Load() || p.stop.Load() {
				p.mu.Unlock()
				break
			}
			n, err := p.pollDriven()
			p.mu.Unlock()
			if err != nil {
				break // the poller's own goroutine meets it too and stops
			}
			if n == 0 {
				if p.dempty++; p.dempty%yieldDriveEvery == 0 {
					p.yield()
				}
			}
		}
		if i%clockEvery == 0 && !p.cfg.noCrowdCut {
			if !p.crowd(&p.dsched) {
				yielded = false
			} else if !yielded {
				// Goroutines wait for a P. Those queued behind this
				// goroutine on its own P (one a timer readied here,
				// the peer this drive's dispatch woke) run now, and
				// the drive goes on.
				yielded = true
				runtime.Gosched()
			} else {
				// They still wait: more of them than cores. Spinning
				// on would keep them, the ones that answer this very
				// request among them, off the CPU, and every other
				// waiter is blocked on this drive. Block like them
				// instead; the poller resumes, and parks if the CPU is
				// still wanted.
				p.st.drivesCut.Add(1)
				break
			}
		}
		if done != nil && i%driveCheckEvery == 0 {
			select {
			case <-done:
				p.leave()
				return true
			default:
			}
		}
	}
	p.leave()
	return true
}

// leave ends a drive: the poller resumes at once if goroutines are
// blocked waiting (they need someone to poll), else after StandbyFor.
func (p *Poller) leave() {
	p.driving.Store(false)
	p.leaves.Add(1) // the standby timer looks at it; no timer call per Wait
	if p.waiting.Load() > 0 {
		p.resumeNow()
	}
}

// WaitingAdd counts goroutines blocked on completions of this poller's
// CQ (delta +1 before blocking, -1 after). While any are, a driver that
// leaves makes the poller resume at once.
func (p *Poller) WaitingAdd(delta int32) {
	if p.waiting.Add(delta) > 0 && delta > 0 {
		p.Resume()
	}
}

// Resume ends the poller's standby now unless a goroutine drives: call
// it when a goroutine is about to wait for completions without driving
// (on a channel, say).
func (p *Poller) Resume() {
	if !p.driving.Load() {
		p.resumeNow()
	}
}

func (p *Poller) resumeNow() {
	select {
	case p.resume <- struct{}{}:
	default:
	}
}

// standbyExpired runs on the standby timer, armed when the poller
// starts standing by. While someone drives, or drove since the timer's
// last look, it looks again StandbyFor later; otherwise the poller
// resumes. So the poller resumes StandbyFor to twice that after the last
// drive, and a Wait costs an atomic add here rather than a timer reset.
func (p *Poller) standbyExpired() {
	if n := p.leaves.Load(); p.seen.Swap(n) != n || p.driving.Load() {
		p.standby.Reset(p.standbyFor)
		return
	}
	p.Resume()
}

// waitDrivers blocks the poller's goroutine while a driver drives. It
// returns at once otherwise.
func (p *Poller) waitDrivers() {
	for p.driving.Load() && !p.stop.Load() {
		p.st.standbys.Add(1)
		p.standby.Reset(p.standbyFor)
		select {
		case <-p.resume:
		case <-p.ctx.Done():
		}
	}
}

// pollDriven is poll for a driver: the poll lock is held, the loop's own
// state is not touched.
func (p *Poller) pollDriven() (int, error) {
	n, err := verbs.PollSpin(p.cq, p.wc, spinPolls)
	if n > 0 {
		p.h.Completions(p.wc[:n:n])
		p.st.batches.Add(1)
		p.st.completions.Add(uint64(n))
		p.st.driven.Add(uint64(n))
	}
	return n, err
}
