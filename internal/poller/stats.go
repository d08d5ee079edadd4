package poller

import "sync/atomic"

// Stats are a poller's counters since New. Each field is read atomically,
// but the set is not one snapshot. Empty polls are published in batches
// while the poller spins, and exactly whenever it parks or stops.
type Stats struct {
	Polls       uint64 // CQ.Poll calls
	EmptyPolls  uint64 // calls that returned nothing
	Completions uint64 // completions handed to the handler
	MaxBatch    uint64 // largest batch seen
	Yields      uint64 // runtime.Gosched calls while spinning
	// SpinsDenied counts the times an Adaptive poller found as many
	// pollers spinning as the process allows (GOMAXPROCS/2, at least 1)
	// and parked without spinning.
	SpinsDenied uint64
	// SpinsCut counts the spins a poller ended early because goroutines
	// were waiting for a P: an Adaptive one before Config.Spin had
	// passed, a Busy one (with a completion channel) at all. It parked.
	SpinsCut uint64
	Arms     uint64 // ReqNotify calls
	// Repolled counts completions found by the poll between arming and
	// parking: each would have been lost without it.
	Repolled uint64
	Parks    uint64 // waits on the completion channel
	Events   uint64 // events taken from the channel (each acked)
	Wakeups  uint64 // waits that ended without an event: Kick or Close
	Kicks    uint64 // Kick calls that found the poller parked
	// KicksSkipped counts the Kick calls that left a parked Adaptive
	// poller parked because it could not have spun.
	KicksSkipped uint64
	// Direct counts completions handled in the provider's goroutine
	// that raised their event (a DirectChannel; also in Completions).
	Direct uint64
	// Run to completion (Busy mode, drive.go).
	Drives   uint64 // Drive calls that drove
	Driven   uint64 // completions a driver polled (also in Completions)
	Standbys uint64 // times the poller blocked while a driver drove
	// Looks counts the standby timer's polls of the CQ once nobody had
	// driven for StandbyFor (also in Polls).
	Looks uint64
	// DrivesCut counts the drives that ended before their future
	// resolved because goroutines were waiting for a P.
	DrivesCut uint64
	// Backlogs counts the probes that found a backlog of goroutines
	// waiting for Ps (4 per P): a Busy poller then behaves as an
	// Adaptive one, and Wait does not drive, for the next millisecond.
	Backlogs uint64
	// LongSpins counts the Adaptive spins longer than DefaultSpin: the
	// poller's wakes had lately cost more (window.go).
	LongSpins uint64
}

type counters struct {
	batches      atomic.Uint64 // non-empty polls
	empty        atomic.Uint64
	completions  atomic.Uint64
	maxBatch     atomic.Uint64
	yields       atomic.Uint64
	spinsDenied  atomic.Uint64
	spinsCut     atomic.Uint64
	arms         atomic.Uint64
	repolled     atomic.Uint64
	parks        atomic.Uint64
	events       atomic.Uint64
	wakeups      atomic.Uint64
	kicks        atomic.Uint64
	kicksSkipped atomic.Uint64
	direct       atomic.Uint64
	drives       atomic.Uint64
	driven       atomic.Uint64
	standbys     atomic.Uint64
	looks        atomic.Uint64
	drivesCut    atomic.Uint64
	backlogs     atomic.Uint64
	longSpins    atomic.Uint64
}

// Stats reads the counters.
func (p *Poller) Stats() Stats {
	c := &p.st
	b, e := c.batches.Load(), c.empty.Load()
	return Stats{
		Polls:        b + e,
		EmptyPolls:   e,
		Completions:  c.completions.Load(),
		MaxBatch:     c.maxBatch.Load(),
		Yields:       c.yields.Load(),
		SpinsDenied:  c.spinsDenied.Load(),
		SpinsCut:     c.spinsCut.Load(),
		Arms:         c.arms.Load(),
		Repolled:     c.repolled.Load(),
		Parks:        c.parks.Load(),
		Events:       c.events.Load(),
		Wakeups:      c.wakeups.Load(),
		Kicks:        c.kicks.Load(),
		KicksSkipped: c.kicksSkipped.Load(),
		Direct:       c.direct.Load(),
		Drives:       c.drives.Load(),
		Driven:       c.driven.Load(),
		Standbys:     c.standbys.Load(),
		Looks:        c.looks.Load(),
		DrivesCut:    c.drivesCut.Load(),
		Backlogs:     c.backlogs.Load(),
		LongSpins:    c.longSpins.Load(),
	}
}
