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
// by (blocked, using no CPU) once anyone drives, and spins again only
// when a goroutine waits for a completion without driving (WaitingAdd,
// Resume). Meanwhile, once nobody has driven for StandbyFor, its standby
// timer looks at the CQ every StandbyFor and handles what it finds, so a
// completion nobody waits for (a released future's, a peer's credit
// frame) is polled twice StandbyFor late at worst; if it found any, the
// poller spins again.
//
// The poller used to resume spinning StandbyFor after the last drive
// whatever happened. A loop that waits for its own operation and then
// spins on memory for the peer's WRITE (rdmaperf write_lat, as
// ib_write_lat) then had two threads spinning per process whenever an
// answer was a millisecond late, and on two CPUs (rxe under TCG) the
// late answers fed themselves: the second spinner keeps the CPUs full,
// so sysmon retakes the P of every long cgo call (a post on rxe sends
// the packet in the call) and then wakes every 20 µs for a millisecond
// (test/perf/switches.sh -W: 10,992 of the run's 14,201 wakes of the
// program's threads were sysmon's; 4,108 of 5,680 with this standby).
//
// The poll lock serializes the handler: it is called by one goroutine at
// a time, whichever polls, as before.

// StandbyFor is how often a standing-by Busy poller's timer looks
// whether anyone drove since its last look, and if not, at the CQ. A
// waiter that drives (a ping-pong, a window of operations) costs the
// poller nothing; a completion nobody waits for is polled twice this
// late at worst.
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
// blocked waiting (they need someone to poll); otherwise its standby
// timer looks at the CQ (no timer call per Wait).
func (p *Poller) leave() {
	p.driving.Store(false)
	p.leaves.Add(1) // the standby timer looks at it
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
// starts standing by, and re-arms it while the poller stands by. While
// goroutines drive (one drove since its last look), they poll for
// everyone. Once none has for StandbyFor, it polls the CQ once and hands
// what it finds to the handler; if it found anything, nobody drives for
// the traffic, and the poller spins again. So a completion nobody waits
// for is polled StandbyFor to twice that late, and while drivers still
// come by the timer neither polls nor wakes the poller (a ping-pong's
// SEND completion is left for the next drive).
func (p *Poller) standbyExpired() {
	if !p.standing.Load() {
		return // the poller spins again; waitDrivers re-arms the timer
	}
	if l := p.leaves.Load(); p.seen.Swap(l) == l && !p.driving.Load() && p.mu.TryLock() {
		if p.ended.Load() || p.stop.Load() {
			p.mu.Unlock()
			return
		}
		n, err := verbs.PollSpin(p.cq, p.wc, 1)
		if n > 0 {
			p.h.Completions(p.wc[:n:n])
			p.st.batches.Add(1)
			p.st.completions.Add(uint64(n))
		} else {
			p.st.empty.Add(1)
		}
		p.st.looks.Add(1)
		p.mu.Unlock()
		if n > 0 || err != nil {
			// Not Resume, which leaves a poller whose driver came back
			// meanwhile blocked with no timer armed: waitDrivers re-arms
			// it. An error: the poller's own poll meets it and stops.
			p.resumeNow()
			return
		}
	}
	p.standby.Reset(p.standbyFor)
}

// waitDrivers blocks the poller's goroutine while a driver drives. It
// returns at once otherwise.
func (p *Poller) waitDrivers() {
	for p.driving.Load() && !p.stop.Load() {
		p.st.standbys.Add(1)
		p.standing.Store(true)
		p.standby.Reset(p.standbyFor)
		select {
		case <-p.resume:
		case <-p.ctx.Done():
		}
		p.standing.Store(false)
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
