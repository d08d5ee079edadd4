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
// the futures. The root package re-exports its modes (rdma.PollMode) and
// counters (rdma.PollerStats).
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
// # Measurements
//
// docs/poller.md has the measurements behind the defaults, run to
// completion (Busy) and its behaviour when goroutines outnumber cores.
package poller
