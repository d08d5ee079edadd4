package poller

import "time"

// The Adaptive spin window, measured.
//
// Spinning for as long as a park costs bounds the waste at twice the best
// choice made in hindsight, whatever the gaps between completions (the
// ski-rental rule; docs/poller.md). DefaultSpin is that rule for a park
// of 39-44 µs, as measured on the development machine. Where waking a
// parked poller costs more (rxe under emulation: an 8 B ping-pong's
// typical round trip with Adaptive pollers took 0.9-1.4 ms against
// 65-140 µs with Busy ones, nearly every answer coming after the poller
// had parked, test/perf/events.sh), a 50 µs spin parks before nearly
// every completion, and each pays the dear wake.
//
// So an Adaptive poller with the default Config.Spin measures its wakes:
// a Kick that finds it parked (a post while it sleeps) stamps the time,
// and the poller, once running again, takes the time since as one sample
// of what a wake costs. A Kick's wake is the Go side of an event's (the
// netpoller, a thread woken, the goroutine run), not the kernel's
// delivery of the event: a lower bound of a park's cost. The poller
// spins for twice the mean of the recent samples, never less than
// DefaultSpin nor more than MaxSpin. A poller whose events are handled
// where they are raised (soft's DirectChannel) is never kicked awake and
// keeps DefaultSpin (rdma gives soft an explicit spin anyway). An
// explicit Config.Spin is used as given.

// MaxSpin is the longest window an Adaptive poller with the default
// Config.Spin measures itself into. Where wakes cost that much the CPUs
// are few or slow, and a spinner takes them from the work that brings
// its completions (rxe's, on two emulated CPUs): with 1 ms, the
// bandwidth of a stream of 64 KiB SENDs with Adaptive pollers fell by
// about a tenth (docs/history/performance.md), with 200 µs it did not.
const MaxSpin = 4 * DefaultSpin

// wakeWeight is the weight of the newest sample in the mean of the wake
// costs, as a shift: 1/8.
const wakeWeight = 3

// window is the spin window of the next Adaptive spin, in ns: twice the
// mean cost of a Kick's wake, which leaves out the kernel's part of an
// event's.
func (p *Poller) window(ls *loopState) int64 {
	return min(max(2*ls.wakeCost, p.spinMin), p.spinMax)
}

// wakeSample adds the cost of one wake, in ns, to the mean.
func (ls *loopState) wakeSample(d int64) {
	if d <= 0 {
		return
	}
	if ls.wakeCost == 0 {
		ls.wakeCost = d
		return
	}
	ls.wakeCost += (d - ls.wakeCost) >> wakeWeight
}

// spinBounds are the least and most an Adaptive poller spins for a
// Config.Spin: DefaultSpin and MaxSpin when it was left zero, the spin
// given both otherwise.
func spinBounds(spin time.Duration) (least, most int64) {
	if spin == 0 {
		return int64(DefaultSpin), int64(MaxSpin)
	}
	return int64(spin), int64(spin)
}
