package poller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Mode is how a poller waits when its CQ is empty.
type Mode uint8

const (
	// Adaptive spins for Config.Spin (see window.go) after the last
	// completion, then arms the CQ, polls once more and parks on the
	// completion channel. It is the zero Mode and the default.
	Adaptive Mode = iota
	// Busy spins while the CPU is free. It holds an OS thread and a P,
	// except once a waiting goroutine has polled the CQ itself (Drive):
	// then it stands by until a goroutine waits without driving, its
	// timer looking at the CQ once nobody has driven for StandbyFor
	// (drive.go). When goroutines wait for a P, drivers give up and
	// block and the poller parks on its completion channel, as Adaptive
	// does; under a backlog it is Adaptive for a millisecond. With 16
	// goroutines on 2 cores this took Busy from about 5× Adaptive's time
	// per request to about 1.4×. See "Run to completion" and "More
	// goroutines than cores" in docs/poller.md.
	Busy
	// Event never spins: it polls until the CQ is empty, arms, polls once
	// more and parks until the next event.
	Event
)

func (m Mode) String() string {
	switch m {
	case Adaptive:
		return "adaptive"
	case Busy:
		return "busy"
	case Event:
		return "event"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode is the Mode named by s ("adaptive", "busy" or "event").
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{Adaptive, Busy, Event} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("poller: %w: unknown mode %q (want adaptive, busy or event)", verbs.ErrInvalid, s)
}

// Defaults, chosen from the measurements in docs/poller.md.
const (
	DefaultBatch = 64
	MinBatch     = 32
	MaxBatch     = 4096
	DefaultSpin  = 50 * time.Microsecond
)

// Handler receives the completions of one CQ.
//
// Completions is called on the poller's goroutine, one batch at a time,
// in CQ order; or, one batch at a time still, on a driver's (drive.go)
// or on the provider's goroutine that raised an event (direct). It must not block, must not call Close on its own poller,
// and must not keep wc (or any part of it) after it returns: the poller
// reuses the array for the next batch. The handler is library code whose
// only job is to complete futures (close a channel, store a result,
// return a buffer to a table); user code, callbacks included, never runs
// on a poller. A panic in the handler crashes the program.
type Handler interface {
	Completions(wc []verbs.WorkCompletion)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(wc []verbs.WorkCompletion)

// Completions calls f(wc).
func (f HandlerFunc) Completions(wc []verbs.WorkCompletion) { f(wc) }

// Config configures a Poller. The zero Config is the default: Adaptive,
// batches of 64, a 50 µs spin (longer where wakes cost more), one yield
// after each burst, automatic YieldEvery, and an ordinary goroutine
// (only Busy pollers are locked to their OS threads by default). The
// package documentation gives the measurements behind these choices.
type Config struct {
	// Mode is Adaptive (the zero value), Busy or Event.
	Mode Mode
	// Batch is how many completions one Poll may return, MinBatch to
	// MaxBatch. Zero means DefaultBatch.
	Batch int
	// Spin is how long an Adaptive poller keeps polling an empty CQ
	// after the last completion before it parks. Zero means DefaultSpin,
	// or, once the poller has measured its wake-ups to cost more than
	// half of it, twice what they cost, up to MaxSpin (window.go). Busy
	// and Event ignore it.
	Spin time.Duration
	// YieldEvery makes a spinning poller (Busy, and Adaptive while it
	// spins) call runtime.Gosched after every YieldEvery consecutive empty
	// polls, so that goroutines and timers queued on its P get to run.
	// Zero is automatic: every 1024 empty polls while GOMAXPROCS is 1
	// (without a yield a Busy poller would hold the only P until the
	// runtime preempts it, some 10-20 ms), never otherwise. Negative
	// means never. On a locked thread each yield hands the P to another
	// thread and back, which costs microseconds.
	YieldEvery int
	// NoIdleYield stops a spinning poller from yielding once when it
	// finds the CQ empty after handling completions. That yield lets the
	// goroutines the handler woke run on the poller's P at once instead
	// of waiting, tens of microseconds, for another P to steal them.
	NoIdleYield bool
	// Lock says whether the poller's goroutine is locked to its OS
	// thread. The zero value, LockAuto, locks a Busy poller and leaves
	// Adaptive and Event pollers on ordinary goroutines: see "Threads" in
	// docs/poller.md for why.
	Lock ThreadLock
	// CPUs pins the poller's OS thread to this set of CPUs
	// (sched_setaffinity; Linux only, ErrNotSupported elsewhere), as
	// busy polling on isolated cores wants. Pinning implies the thread
	// lock, whatever the mode (LockNever with CPUs is invalid), and the
	// pinned thread is never handed to other goroutines: it exits with
	// the poller. New refuses a CPU the process may not use (see
	// CheckCPUs); Start returns once the thread is pinned. Empty means
	// no pinning. Only the poller's own thread is pinned: a goroutine
	// that drives a Busy poller (Drive) polls from its own thread.
	CPUs []int

	// noRepoll drops the poll between arming and parking. Only the tests
	// set it, to show that they catch the completion it would lose.
	noRepoll bool
	// noCrowdCut keeps drivers driving while goroutines wait for a P.
	// Only the tests of the drive's own mechanics set it: their
	// spinUntil loops are such goroutines.
	noCrowdCut bool
}

// ThreadLock says whether a poller runs locked to its OS thread
// (runtime.LockOSThread).
type ThreadLock uint8

const (
	// LockAuto locks Busy pollers only. It is the zero ThreadLock and the
	// default.
	LockAuto ThreadLock = iota
	// LockAlways locks every poller to its thread.
	LockAlways
	// LockNever runs every poller on an ordinary goroutine.
	LockNever
)

func (l ThreadLock) String() string {
	switch l {
	case LockAuto:
		return "auto"
	case LockAlways:
		return "always"
	case LockNever:
		return "never"
	}
	return fmt.Sprintf("ThreadLock(%d)", uint8(l))
}

// locked says whether a poller of mode m runs locked to its thread.
func (l ThreadLock) locked(m Mode) bool {
	return l == LockAlways || (l == LockAuto && m == Busy)
}

// locked says whether the poller runs locked to its thread: as Lock
// says, and always when it is pinned.
func (c *Config) locked() bool { return len(c.CPUs) > 0 || c.Lock.locked(c.Mode) }

// CheckCPUs checks a CPU set for Config.CPUs and returns it sorted and
// without duplicates (nil for an empty one). Every CPU must be one that
// the process may run on, as sched_getaffinity reports for the calling
// thread (so, the process's set unless the caller pinned its own
// thread); otherwise the error wraps ErrInvalid and names the CPU and
// the allowed set. Off Linux a non-empty set is ErrNotSupported.
func CheckCPUs(cpus []int) ([]int, error) {
	if len(cpus) == 0 {
		return nil, nil
	}
	set := slices.Clone(cpus)
	slices.Sort(set)
	set = slices.Compact(set)
	if set[0] < 0 || set[len(set)-1] >= maxCPU {
		bad := set[0]
		if bad >= 0 {
			bad = set[len(set)-1]
		}
		return nil, fmt.Errorf("poller: %w: CPU %d (want 0..%d)", verbs.ErrInvalid, bad, maxCPU-1)
	}
	allowed, err := allowedCPUs()
	if err != nil {
		return nil, err
	}
	for _, c := range set {
		if _, ok := slices.BinarySearch(allowed, c); !ok {
			return nil, fmt.Errorf("poller: %w: CPU %d is not one this process may run on (allowed: %s)", verbs.ErrInvalid, c, FormatCPUs(allowed))
		}
	}
	return set, nil
}

// FormatCPUs writes a sorted CPU set as a list of ranges, as
// /proc/self/status's Cpus_allowed_list does: "0-3,8,10-11".
func FormatCPUs(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// ErrClosed is returned by Start on a closed poller. It wraps
// net.ErrClosed.
var ErrClosed = verbs.ErrClosed

// ErrSharedChannel is the poller's error when its completion channel
// delivers an event for another CQ. Every poller needs a completion
// channel of its own.
var ErrSharedChannel = errors.New("poller: completion channel shared with another CQ")

const (
	stateNew int32 = iota
	stateRunning
	stateClosed
)

// Poller polls one CQ on its own goroutine (locked to an OS thread as
// Config.Lock says) and hands every completion to its Handler. Its
// methods are safe for concurrent use.
type Poller struct {
	cq  verbs.CQ
	ch  verbs.CompChannel
	h   Handler
	cfg Config
	wc  []verbs.WorkCompletion // reused for every Poll

	state     atomic.Int32
	stop      atomic.Bool
	closeOnce sync.Once
	done      chan struct{}
	err       error // the reason the loop ended; written before done closes

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	// Kick: the poller sets parked before it checks kick; Kick sets kick
	// before it checks parked. One of the two always sees the other.
	parked  atomic.Bool
	kick    atomic.Bool
	kmu     sync.Mutex
	kctx    context.Context // the wait's context; Kick cancels it
	kcancel context.CancelFunc
	// directEvents: the CQ's events are handled where they are raised
	// (a DirectChannel, the soft provider), so a parked poller never
	// waits for a completion, and Kick has nothing to hasten.
	directEvents bool

	// Drive (drive.go): mu serializes polling and the handler between the
	// poller's goroutine and a driver; ended is set, under mu, when the
	// loop has exited, so that no driver polls a CQ its owner may be
	// about to destroy.
	mu         sync.Mutex
	ended      atomic.Bool
	driving    atomic.Bool
	waiting    atomic.Int32
	resume     chan struct{} // one slot: wakes the poller from standby
	standing   atomic.Bool   // the poller is blocked in waitDrivers
	leaves     atomic.Uint64 // drives ended; the standby timer reads it
	seen       atomic.Uint64 // leaves at the standby timer's last look
	standby    *time.Timer
	standbyFor time.Duration // StandbyFor; tests change it
	dsched     schedProbe    // the driver's (one at a time: driving)
	dempty     uint64        // the drivers' empty polls, across drives (driving)
	crowdAt    atomic.Int64  // nanotime of the last backlog seen (crowd); 0: none lately
	holdFor    int64         // crowdHold in ns; tests change it before Start

	tid atomic.Int32 // the locked thread (ThreadID)

	spinMin, spinMax int64        // an Adaptive spin's window, least and most (window.go)
	kickAt           atomic.Int64 // when a Kick found the poller parked; 0: none since it parked

	st counters
}

// New makes a poller for cq. ch is cq's completion channel, used by
// Adaptive and Event; Busy accepts a nil ch. ch must serve cq alone: an
// event for another CQ stops the poller with ErrSharedChannel. The poller
// does not own cq or ch; close the poller before either.
func New(cq verbs.CQ, ch verbs.CompChannel, h Handler, cfg Config) (*Poller, error) {
	if cq == nil || h == nil {
		return nil, fmt.Errorf("poller: %w: nil CQ or handler", verbs.ErrInvalid)
	}
	switch cfg.Mode {
	case Busy:
	case Adaptive, Event:
		if ch == nil {
			return nil, fmt.Errorf("poller: %w: %s mode needs a completion channel", verbs.ErrInvalid, cfg.Mode)
		}
	default:
		return nil, fmt.Errorf("poller: %w: %s", verbs.ErrInvalid, cfg.Mode)
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Batch < MinBatch || cfg.Batch > MaxBatch {
		return nil, fmt.Errorf("poller: %w: batch %d outside %d..%d", verbs.ErrInvalid, cfg.Batch, MinBatch, MaxBatch)
	}
	if cfg.Lock > LockNever {
		return nil, fmt.Errorf("poller: %w: %s", verbs.ErrInvalid, cfg.Lock)
	}
	if cfg.Spin < 0 {
		return nil, fmt.Errorf("poller: %w: negative spin %v", verbs.ErrInvalid, cfg.Spin)
	}
	spinMin, spinMax := spinBounds(cfg.Spin)
	if cfg.Spin == 0 {
		cfg.Spin = DefaultSpin
	}
	if len(cfg.CPUs) > 0 && cfg.Lock == LockNever {
		return nil, fmt.Errorf("poller: %w: pinning to CPUs needs the thread lock (Lock %s)", verbs.ErrInvalid, cfg.Lock)
	}
	cpus, err := CheckCPUs(cfg.CPUs)
	if err != nil {
		return nil, err
	}
	cfg.CPUs = cpus // a copy: the caller's slice may change
	p := &Poller{
		cq:         cq,
		ch:         ch,
		h:          h,
		cfg:        cfg,
		wc:         make([]verbs.WorkCompletion, cfg.Batch),
		done:       make(chan struct{}),
		resume:     make(chan struct{}, 1),
		standbyFor: StandbyFor,
		holdFor:    int64(crowdHold),
		spinMin:    spinMin,
		spinMax:    spinMax,
	}
	if d, ok := ch.(verbs.DirectChannel); ok && cfg.Mode != Busy {
		d.SetDirect(p.direct)
		p.directEvents = true
	}
	p.standby = time.AfterFunc(time.Hour, p.standbyExpired)
	p.standby.Stop()
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.kctx, p.kcancel = context.WithCancel(p.ctx)
	return p, nil
}

// Config is the configuration in effect, defaults filled in (an
// automatic YieldEvery stays 0).
func (p *Poller) Config() Config { return p.cfg }

// Start starts the polling goroutine. It fails on a poller that was
// started or closed before. A locked poller's Start returns once the
// goroutine is locked to its thread (ThreadID) and, if Config.CPUs says
// so, pinned; it returns the error if the pinning failed, and the poller
// has stopped then.
func (p *Poller) Start() error {
	if !p.state.CompareAndSwap(stateNew, stateRunning) {
		if p.state.Load() == stateClosed {
			return ErrClosed
		}
		return fmt.Errorf("poller: %w: already started", verbs.ErrInvalid)
	}
	if !p.cfg.locked() {
		go p.run(nil)
		return nil
	}
	started := make(chan error, 1)
	go p.run(started)
	return <-started
}

// ThreadID is the OS thread ID (Linux's tid) of a locked poller's
// goroutine once Start has returned: the thread that Config.CPUs pins,
// for tools such as taskset or chrt. It is 0 for a poller that is not
// locked, before Start, and off Linux.
func (p *Poller) ThreadID() int { return int(p.tid.Load()) }

// Close stops the poller, waking it if it is parked, and returns once its
// goroutine has exited; the handler is not called after that. Completions
// still in the CQ stay there. Close is safe to call more than once and
// from several goroutines, but not from the handler. It returns nil; Err
// tells why the loop ended.
func (p *Poller) Close() error {
	p.closeOnce.Do(func() {
		if d, ok := p.ch.(verbs.DirectChannel); ok && p.cfg.Mode != Busy {
			d.SetDirect(nil)
		}
		p.stop.Store(true)
		p.cancel()
		if p.state.CompareAndSwap(stateNew, stateClosed) {
			close(p.done) // never started
		}
	})
	<-p.done
	p.standby.Stop()
	p.mu.Lock() // a driver in the middle of a poll finishes it first
	p.ended.Store(true)
	p.mu.Unlock()
	p.state.Store(stateClosed)
	return nil
}

// Done is closed when the polling goroutine has exited: after Close, or
// after an error (see Err).
func (p *Poller) Done() <-chan struct{} { return p.done }

// Err is the error that stopped the poller: nil while it runs and after a
// plain Close; otherwise the CQ's or channel's error, or ErrSharedChannel.
// When Err is not nil the poller has stopped polling; the owner must fail
// the CQ's outstanding work.
func (p *Poller) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Kick makes a parked Adaptive or Event poller poll again at once, and an
// Adaptive one spin for another Spin. Call it after posting work whose
// completion should be picked up by spinning rather than by an event. A
// parked Adaptive poller that could not spin (the process has as many
// spinning as it allows) is left parked: it would only poll once and park
// again, and the completion's event wakes it. Kick costs two atomic
// operations while the poller is not parked. Busy pollers ignore it.
func (p *Poller) Kick() {
	if p.directEvents {
		return
	}
	if p.cfg.Mode == Adaptive && p.parked.Load() && spinners.Load() >= spinLimit.Load() {
		p.st.kicksSkipped.Add(1)
		return
	}
	p.kick.Store(true)
	if p.parked.Load() {
		p.kickAt.CompareAndSwap(0, nanotime()) // the wake's cost is a sample of a park's (window.go)
		p.kmu.Lock()
		p.kcancel()
		p.kmu.Unlock()
		p.st.kicks.Add(1)
	}
}

// waitCtx is the context of the next wait: the current one unless a Kick
// cancelled it.
func (p *Poller) waitCtx() context.Context {
	p.kmu.Lock()
	defer p.kmu.Unlock()
	if p.kctx.Err() != nil && p.ctx.Err() == nil {
		p.kcancel()
		p.kctx, p.kcancel = context.WithCancel(p.ctx)
	}
	return p.kctx
}

// direct is a DirectChannel's handling of an event of the poller's CQ, in
// the provider's goroutine that raised it, while the poller is parked
// (the CQ is armed only then): it polls and hands the completions to the
// handler as a woken poller would, and re-arms the CQ, so that the
// completion reaches its waiter without waking the poller's goroutine
// first. For the soft provider between processes that is one goroutine
// hand-off fewer on the way of every message (docs/poller.md).
func (p *Poller) direct(verbs.CQ) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.stop.Load() && !p.ended.Load() {
		n, err := verbs.PollSpin(p.cq, p.wc, 1)
		if err == nil && n == 0 {
			// Arm, then poll again: a completion that came before the
			// arm raised no event.
			if err = p.cq.ReqNotify(false); err == nil {
				n, err = verbs.PollSpin(p.cq, p.wc, 1)
			}
			if err == nil && n == 0 {
				return
			}
		}
		if err != nil {
			// The poller's goroutine meets it too at its next poll, and
			// stops: wake it.
			p.kick.Store(true)
			p.kmu.Lock()
			p.kcancel()
			p.kmu.Unlock()
			return
		}
		p.h.Completions(p.wc[:n:n])
		p.st.batches.Add(1)
		p.st.completions.Add(uint64(n))
		p.st.direct.Add(uint64(n))
	}
}
