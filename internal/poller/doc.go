// Package poller polls completion queues and dispatches their
// completions.
//
// One Poller serves one CQ. It runs on a goroutine of its own (a Busy
// poller's is locked to its OS thread: see Threads), polls up to
// Config.Batch completions per call (64 by default, at least 32) into an
// array it reuses, and hands each batch to a Handler. Polling and
// dispatch allocate nothing per completion or per batch.
//
// The Handler is library code: it completes futures (closes a channel,
// stores a result, returns a buffer) and returns. It must not block and
// must not keep the slice. User code, callbacks included, never runs on a
// poller; anything that runs user code belongs on a bounded pool fed by
// the futures. This package is public so that options can name its Mode
// and Stats; only go-rdma itself can build a Poller, since CQs come from
// internal packages.
//
// # Modes
//
// Busy polls without pause while the CPU is free, and parks only when
// goroutines wait for a P (below). Adaptive polls like Busy
// while completions keep coming, and parks when the CQ has stayed empty
// for Config.Spin. Event never spins: it polls until a poll comes back
// short, then parks.
//
// An Adaptive poller spins only while the CPU is not wanted elsewhere.
// At most GOMAXPROCS/2 of them (at least one) spin at once in a process,
// as the Go scheduler keeps at most half its Ps spinning for work; the
// others behave as Event pollers until a spinner parks
// (Stats.SpinsDenied). And a spinner parks early, before Config.Spin has
// passed, when it sees goroutines waiting for a P (the runtime's
// /sched/goroutines/runnable count, read every 16 empty polls;
// Stats.SpinsCut). Spinning pollers take the cores that the goroutines
// they wake need: on 2 cores, with the stream over the soft provider's
// TCP transport, the two rules took one connection from 21-26 to 25-30
// Gb/s and four from 0.60-0.67× to 0.69-0.74× of TCP loopback, and the
// 64 B stream ping-pong from 53 to 44 µs.
//
// Parking is one sequence, and its order is what loses nothing:
//
//	ReqNotify  arm the CQ: the next completion sends an event
//	Poll       poll again: a completion that arrived after the last empty
//	           poll but before the arm raised no event and would sit in
//	           the CQ for ever
//	GetEvent   wait on the completion channel through Go's netpoller (no
//	           thread is blocked in a cgo call), or until Kick or Close
//	AckEvents  acknowledge the event at once, then poll until empty; the
//	           next park re-arms and polls again
//
// The tests drive a fake CQ that pushes completions at each of these
// moments (after the empty poll, before and after the arm, at the ack)
// and from many producers, and check at every block that the CQ is armed
// and empty; dropping the poll after the arm makes them fail.
//
// A completion channel must serve one CQ: an event for another CQ stops
// the poller with ErrSharedChannel. Kick makes a parked poller poll (and
// an Adaptive one spin) again, except an Adaptive one that could not spin
// for the spin limit (below): the completion's event wakes that one. It
// costs two atomic operations when the poller is not parked. Close wakes
// a parked poller and waits for its goroutine to exit.
//
// # Yielding
//
// A goroutine that the handler wakes (a future's waiter) is put in the
// poller's P's runnext slot. While the poller keeps spinning on that P,
// another P may take it only through work stealing, which sleeps
// usleep(3) before taking a runnext goroutine. With Linux's default 50 µs
// timer slack, a 3 µs nanosleep lasts 83 µs (median; p90 104 µs) on this
// machine. That is the "about 100 µs" that a goroutine woken by a
// spinning poller waits. So a spinning poller
// calls runtime.Gosched once each time it finds the CQ empty after
// handling completions (Config.NoIdleYield turns this off). With
// GOMAXPROCS 1 it also yields every 1024 empty polls (Config.YieldEvery):
// otherwise timers and all other goroutines would wait until the runtime
// preempts it, 10-20 ms.
//
// # Measurements
//
// On the development machine: a VM with 2 AMD EPYC vCPUs, Go 1.26.8,
// GOMAXPROCS 2 unless stated, while other VMs ran on the same host (load
// average 2-4). Figures are medians over 5 runs of the median (p50) of
// 1500-3000 operations, from the benchmarks in this package, with the
// fake CQ and a pipe fd as the completion channel (waited for through
// the netpoller, as the verbs provider does). The 99th percentiles of
// the parking modes ranged from 0.1 to 5 ms in these runs and follow the
// host's load more than this code.
//
//	dispatch, batch 64, 0 allocs/op                       6-30 ns per completion
//	Kick on a spinning poller                             2.4 ns
//	park+wake round trip, goroutine locked to its thread  16.7 µs (two wakes; 0.34 µs unlocked)
//	completion to handler, poller spinning                0.3 µs
//	completion to handler, poller parked (locked)         39-44 µs
//
// Completion to handler to waiting goroutine, "e2e", split into the wake
// of the poller (poll) and of the waiter (wake). These were measured when
// every poller was locked to its thread; "unlocked" rows are today's
// defaults for Adaptive and Event (see Threads):
//
//	GOMAXPROCS 2                 poll    wake    e2e
//	busy, no yield               3.0     71.7    75.1 µs  the "100 µs" effect
//	busy, yield every 1024       3.9     20.8    26.9
//	busy (default yields)        2.5     13.8    16.3
//	adaptive, locked, no yield  17.3     73.6    92.6
//	adaptive, locked             2.8     15.2    18.4
//	adaptive, unlocked           2.4      0.2     2.7
//	event, locked               18.8     20.1    41.1
//	event, unlocked             12.6      7.4    21.8
//
//	GOMAXPROCS 1                 poll    wake    e2e
//	busy, no yield              20.2   20 300  20 300 µs  waiter runs when preempted
//	busy (default yields)        3.8      9.1    35.1
//	adaptive, locked            18.4     19.8    38.3
//	adaptive, unlocked           0.14     0.16    0.30
//	event, locked                9.6      8.1    23.6
//
// # Defaults and why
//
// Adaptive is the default Mode. Busy holds a P and a core while the CPU
// is free: on a 2-core machine one poller is half of it, and at
// GOMAXPROCS 1 it starves everything unless it yields. Event pays a park
// and a wake, about 40 µs here, on every burst of completions. Adaptive
// costs what Busy costs while completions come faster than the spin and
// what Event costs when they don't.
//
// The default spin is 50 µs. Spinning for as long as a park costs (39-44
// µs measured) bounds the waste at twice the best choice made in
// hindsight, whatever the gaps between completions: in the sweep
// (BenchmarkSpinSweep) gaps of 20 and 40 µs under a 50 µs spin were
// picked up in 0.3 µs without parking, while a 10 µs spin parked on 74%
// of 40 µs gaps and paid 31 µs each. rsockets polls 10 µs; its wake is
// cheaper than one of a locked thread. The same rule gives a shorter spin
// where a park is cheaper: rdma sets 10 µs for the soft provider, whose
// completion channel is a Go channel, and keeps 50 µs for verbs, whose
// channel is an fd waited for through the netpoller (rdma.WithPollSpin
// overrides both).
//
// # Threads
//
// A Busy poller runs locked to its OS thread: it parks only when
// goroutines wait for a P, so the lock costs little, and the thread can
// be pinned to a core. Adaptive and
// Event pollers park through the netpoller, and a locked goroutine hands
// its P to another thread and back at every park and yield (8 µs per
// wake here): the "unlocked" rows above, 2.7 µs instead of 18 µs from
// completion to waiter at GOMAXPROCS 2. So by default (Config.Lock,
// LockAuto) they run on ordinary goroutines. Over the soft provider's TCP
// transport this doubled the stream's throughput (10-12 to 21-26 Gb/s
// with one connection). LockAlways locks them too, where the thread
// must be pinned (CPU affinity, a per-thread provider resource); the
// figures above without "unlocked" were measured so.
//
// Config.CPUs pins a poller's thread to a set of CPUs, as busy polling
// on isolated cores wants: the goroutine locks its thread and calls
// sched_setaffinity on it, and Start returns once that is done
// (ThreadID names the thread). New refuses a CPU outside the process's
// affinity: sched_setaffinity would drop it silently as long as one CPU
// of the set is allowed. A pinned thread is never unlocked, so it exits
// with the poller instead of carrying the pin to other goroutines (the
// process's main thread, which the runtime never ends, stays parked).
// Drivers (below) are not pinned: they poll from the waiting goroutine's
// thread, which is the caller's to place.
//
// # Run to completion (Busy)
//
// In Busy mode a goroutine that waits for a completion polls the CQ
// itself: Drive (used by rdma's Future.Wait) polls and dispatches from
// the calling goroutine until its future resolves, and the poller's own
// goroutine stands by, blocked, while anyone drives. This is how
// perftest's latency loops wait, and it removes both costs above: no
// thread has to wake the waiter, and no second thread spins beside it.
// One goroutine drives at a time (a poll lock serializes the handler
// between the driver and the poller); others block as usual and are
// woken by the driver's dispatch, an unlocked goroutine, in well under a
// microsecond.
//
// Nothing is left unpolled: the poller resumes at once when a goroutine
// blocks on a completion while nobody drives (WaitingAdd, used by a Wait
// that could not drive and by a post waiting for send credits) or is
// about to select on a future's channel (Resume, used by Done); and 1 to
// 2 ms (StandbyFor to twice that) after the last driver left, whatever
// happens. A loop that does other work between Waits (polling memory for
// a peer's WRITE, say) thus keeps the poller standing by if it waits again
// within 1 ms. The price: a completion that nobody waits for in any of
// these ways is polled up to 2 ms late, which delays only the return of
// its buffer to the pool. A Wait that drives costs no timer call: the
// timer is armed when the poller starts standing by and re-arms itself
// while drives go on.
//
// Measured with BenchmarkPingPong (rdma's bench_test.go: 8 B SEND and
// echo at queue depth 1, half the round trip, p50) on rxe in the VM
// (TCG), 2 runs: busy 19.7-28.9 µs, adaptive 106-117 µs (241-301 µs
// with the thread locked), event 246-249 µs; perftest's ib_send_lat on
// the same device gives about 20 µs.
//
// # More goroutines than cores (Busy)
//
// Run to completion assumes the waiter has a core to itself. When
// goroutines outnumber cores it fails: the driver spins, holding a P,
// until its own future resolves, while the goroutines its dispatch woke
// (the peer that will answer it among them) wait in its P's queue and
// every other waiter is blocked behind its drive. So spinners read the
// runtime's count of runnable goroutines every clockEvery empty polls,
// as Adaptive pollers do:
//
//   - A driver that sees goroutines waiting for a P stops driving and
//     blocks like any other waiter (Stats.DrivesCut); the poller resumes.
//   - A Busy poller with a completion channel (rdma gives every CQ one)
//     that sees them parks on it, as Adaptive does (Stats.SpinsCut).
//   - A backlog, backlogPerP (4) runnable goroutines per P, makes the
//     poller spin and park as an Adaptive one, and Wait block instead of
//     driving, until a millisecond has passed without one
//     (Stats.Backlogs). Without this hold, drives kept starting only to
//     be cut, and the poller spun between them.
//
// A waiter alone on its core (perftest's loop; one goroutine per process
// on a NIC) finds nobody waiting and drives as before, for one
// runtime/metrics read per 16 polls. docs/performance.md ("Busy mode
// with more goroutines than cores") has the profile and the figures:
// with 16 goroutines doing request/response on 2 cores, Busy went from
// about 5× to about 1.4× Adaptive's time per request.
package poller
