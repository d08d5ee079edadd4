package poller

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// flagger sets flags[id] for each completion it sees (ids out of range
// are counted only) and closes all once total reaches target.
type flagger struct {
	*collector
	flags []atomic.Uint32
}

func newFlagger(n int, target uint64) *flagger {
	return &flagger{collector: newCollector(n, target), flags: make([]atomic.Uint32, n)}
}

func (f *flagger) Completions(wc []verbs.WorkCompletion) {
	f.collector.Completions(wc)
	for i := range wc {
		if id := wc[i].WRID; id < uint64(len(f.flags)) {
			f.flags[id].Store(1)
		}
	}
}

// startDriving runs Drive on a goroutine and returns once the poller
// stands by for it; drove receives Drive's result.
func startDriving(t *testing.T, p *Poller, ctx context.Context, flag *atomic.Uint32) <-chan bool {
	t.Helper()
	drove := make(chan bool, 1)
	go func() { drove <- p.Drive(ctx, flag) }()
	if !spinUntil(func() bool { return p.Stats().Standbys > 0 }) {
		t.Fatalf("the poller did not stand by for the driver: %+v", p.Stats())
	}
	return drove
}

func recvOrFail(t *testing.T, ch <-chan bool, what string) bool {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(bound):
		t.Fatalf("%s: not within %v", what, bound)
		return false
	}
}

// TestDrive checks run to completion: while a goroutine drives, the
// poller's own goroutine stands by and every completion is polled and
// dispatched by the driver, which returns once its flag is set.
func TestDrive(t *testing.T) {
	cq := newFakeCQ(64, nil)
	h := newFlagger(8, 8)
	p := mustNew(t, cq, nil, h, Config{Mode: Busy, noCrowdCut: true})
	drove := startDriving(t, p, context.Background(), &h.flags[7])
	for id := range uint64(8) {
		cq.push1(id)
	}
	if !recvOrFail(t, drove, "Drive returns once its completion is dispatched") {
		t.Fatal("Drive did not drive on an idle Busy poller")
	}
	if s := p.Stats(); s.Drives != 1 || s.Driven != 8 || s.Completions != 8 {
		t.Fatalf("stats %+v: want 1 drive that polled all 8 completions", s)
	}
}

// TestDriveOneAtATime: a second Drive while one drives returns false at
// once, and so does Drive on a poller that is not Busy.
func TestDriveOneAtATime(t *testing.T) {
	cq := newFakeCQ(64, nil)
	h := newFlagger(2, 1)
	p := mustNew(t, cq, nil, h, Config{Mode: Busy, noCrowdCut: true})
	drove := startDriving(t, p, context.Background(), &h.flags[0])
	if p.Drive(context.Background(), &h.flags[1]) {
		t.Fatal("a second goroutine drove while the first did")
	}
	cq.push1(0)
	recvOrFail(t, drove, "first driver returns")

	for _, m := range []Mode{Adaptive, Event} {
		ch := newFakeChan()
		q := newFakeCQ(64, ch)
		p := mustNew(t, q, ch, newCollector(1, 1), Config{Mode: m})
		var flag atomic.Uint32
		if p.Drive(context.Background(), &flag) {
			t.Fatalf("%v poller let a goroutine drive", m)
		}
	}
}

// TestDriveContext: a driver whose context ends returns with its flag
// unset, and the poller resumes polling for everyone else.
func TestDriveContext(t *testing.T) {
	cq := newFakeCQ(64, nil)
	h := newFlagger(2, 1)
	p := mustNew(t, cq, nil, h, Config{Mode: Busy, noCrowdCut: true})
	ctx, cancel := context.WithCancel(context.Background())
	drove := startDriving(t, p, ctx, &h.flags[0])
	cancel()
	if !recvOrFail(t, drove, "Drive returns when its context ends") || h.flags[0].Load() != 0 {
		t.Fatal("Drive did not report driving, or the flag was set")
	}
	p.WaitingAdd(1) // as Future.Wait does before blocking
	defer p.WaitingAdd(-1)
	cq.push1(1)
	waitOrFail(t, h.done, "the poller polls after the driver left", p)
}

// TestStandbyEnds checks each way a standing-by poller resumes when
// nobody drives: the standby timer, Resume (a goroutine about to select
// on a future's channel), and WaitingAdd (a goroutine about to block).
// Resume and WaitingAdd are checked with a standby that would last an
// hour.
func TestStandbyEnds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		standby time.Duration
		wake    func(p *Poller)
	}{
		{"timer", StandbyFor, func(*Poller) {}},
		{"Resume", time.Hour, func(p *Poller) { p.Resume() }},
		{"WaitingAdd", time.Hour, func(p *Poller) { p.WaitingAdd(1); p.WaitingAdd(-1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cq := newFakeCQ(64, nil)
			h := newFlagger(2, 2)
			p, err := New(cq, nil, h, Config{Mode: Busy, noCrowdCut: true})
			if err != nil {
				t.Fatal(err)
			}
			p.standbyFor = tc.standby
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			drove := startDriving(t, p, context.Background(), &h.flags[0])
			cq.push1(0)
			recvOrFail(t, drove, "driver returns")
			before := p.Stats().Driven
			tc.wake(p)
			cq.push1(1)
			waitOrFail(t, h.done, "the poller polls again", p)
			if s := p.Stats(); s.Driven != before {
				t.Fatalf("a completion counted as driven with nobody driving: %+v", s)
			}
		})
	}
}

// TestStandbyLooksWithoutSpinning: once a drive has ended and nobody
// waits, a standing-by poller does not spin again; its timer looks at
// the CQ every StandbyFor instead. A completion that comes then is
// handled by a look, not a driver, and the poller spins again. (It used
// to resume spinning StandbyFor after the last drive whatever happened:
// two spinners per process in a loop that waits for its WRITE and then
// spins on memory, drive.go.)
func TestStandbyLooksWithoutSpinning(t *testing.T) {
	cq := newFakeCQ(64, nil)
	h := newFlagger(2, 2)
	p, err := New(cq, nil, h, Config{Mode: Busy, noCrowdCut: true})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	defer p.Close()
	drove := startDriving(t, p, context.Background(), &h.flags[0])
	cq.push1(0)
	require.True(t, recvOrFail(t, drove, "driver returns"))
	// The poller's own polls: a spinning one publishes them every
	// flushEvery empty polls, thousands a millisecond on a fake CQ.
	own := func(s Stats) uint64 { return s.Polls - s.Looks }
	before := p.Stats()
	require.True(t, spinUntil(func() bool { return p.Stats().Looks >= before.Looks+5 }),
		"the standby timer did not look: %+v", p.Stats())
	after := p.Stats()
	assert.Equal(t, own(before), own(after), "the poller polled while standing by with nobody waiting")
	assert.Equal(t, before.Standbys, after.Standbys)

	cq.push1(1)
	waitOrFail(t, h.done, "a look handles the completion", p)
	s := p.Stats()
	assert.Equal(t, after.Driven, s.Driven, "a completion counted as driven with nobody driving")
	require.True(t, spinUntil(func() bool { return own(p.Stats()) > own(s) }),
		"the poller did not spin again after a look found a completion: %+v", p.Stats())
	// The timer, should it fire while the poller spins, neither looks
	// nor re-arms.
	looks := p.Stats().Looks
	p.standbyExpired()
	assert.Equal(t, looks, p.Stats().Looks, "the standby timer looked while the poller spun")
}

// closeCheckCQ fails a Poll that comes after the poller's Close has
// returned: the owner may destroy the CQ then.
type closeCheckCQ struct {
	*fakeCQ
	closed atomic.Bool
	late   atomic.Int32
}

func (q *closeCheckCQ) Poll(wc []verbs.WorkCompletion) (int, error) {
	if q.closed.Load() {
		q.late.Add(1)
	}
	return q.fakeCQ.Poll(wc)
}

// TestCloseWhileDriving: Close ends a drive, and no driver polls the CQ
// after Close has returned.
func TestCloseWhileDriving(t *testing.T) {
	cq := &closeCheckCQ{fakeCQ: newFakeCQ(64, nil)}
	var flag atomic.Uint32 // never set
	p := mustNew(t, cq, nil, newCollector(1, 1), Config{Mode: Busy, noCrowdCut: true})
	drove := startDriving(t, p, context.Background(), &flag)
	p.Close()
	cq.closed.Store(true)
	recvOrFail(t, drove, "Drive returns after Close")
	if n := cq.late.Load(); n != 0 {
		t.Fatalf("%d polls after Close returned", n)
	}
	if p.Drive(context.Background(), &flag) {
		t.Fatal("Drive drove a closed poller")
	}
}

// TestDriveAllocs: driving allocates nothing.
func TestDriveAllocs(t *testing.T) {
	cq := newFakeCQ(64, nil)
	h := newFlagger(1, 1<<62)
	p := mustNew(t, cq, nil, h, Config{Mode: Busy, noCrowdCut: true})
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		h.flags[0].Store(0)
		cq.push1(0)
		p.Drive(ctx, &h.flags[0])
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per drive", allocs)
	}
}

// crowd keeps n goroutines runnable (they yield in a loop) until the
// returned function is called: on GOMAXPROCS 1, goroutines waiting for
// the only P, as when goroutines outnumber cores.
func crowd(t *testing.T, n int) (stop func()) {
	t.Helper()
	prev := runtime.GOMAXPROCS(1)
	var done atomic.Bool
	var exited sync.WaitGroup
	for range n {
		exited.Go(func() {
			for !done.Load() {
				runtime.Gosched()
			}
		})
	}
	return func() {
		done.Store(true)
		exited.Wait()
		runtime.GOMAXPROCS(prev)
	}
}

// Rule: a driver stops driving when goroutines wait for a P, before its
// future resolves: it would keep them, the one that answers its request
// among them, off the CPU (docs/history/performance.md).
func TestDriveCutWhenCrowded(t *testing.T) {
	stop := crowd(t, 1)
	defer stop()
	p := mustNew(t, newFakeCQ(64, nil), nil, newCollector(1, 1), Config{Mode: Busy})
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var flag atomic.Uint32 // never set
	require.True(t, p.Drive(ctx, &flag), "Drive did not drive an idle Busy poller")
	require.NoError(t, ctx.Err(), "the drive ran until its context ended")
	assert.Equal(t, uint64(1), p.Stats().DrivesCut)
	assert.Zero(t, p.Stats().Backlogs, "one goroutine waiting is no backlog")
	var again atomic.Uint32
	again.Store(1)
	assert.True(t, p.Drive(ctx, &again), "a driver that was cut made the next Wait block")
}

// Rule: a driver that finds goroutines waiting for a P lets those queued
// behind it on its own P run first, and is cut only if some still wait:
// the peer that answers its request (readied by the drive's own
// dispatch, here started just before it) answers, and the drive ends as
// the future resolves, with no hand-off to the poller. Before, the drive
// was cut at once (on rxe, 8 % of a ping-pong's drives).
func TestDriveYieldsFirst(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	p := mustNew(t, newFakeCQ(64, nil), nil, newCollector(1, 1), Config{Mode: Busy})
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var flag atomic.Uint32
	answered := make(chan struct{})
	go func() { // runs only when the driver lets its P go
		flag.Store(1)
		close(answered)
	}()
	require.True(t, p.Drive(ctx, &flag))
	<-answered
	assert.Zero(t, p.Stats().DrivesCut, "the drive was cut for a goroutine that ran at its yield")
}

// Rule: a goroutine that waits by driving yields its P every
// yieldDriveEvery empty polls counted across its drives, so that short
// drives, one per round trip of a ping-pong, yield too: a goroutine that
// never yields is retaken by sysmon every 10 ms while in a cgo call, and
// sysmon then wakes every 20 µs for a millisecond. Before, the count
// started again at each drive, and such drives never yielded.
func TestDriveYieldsAcrossDrives(t *testing.T) {
	cq := newFakeCQ(64, nil)
	var driven atomic.Pointer[Poller]
	const emptyPerDrive = 10
	var flag atomic.Uint32
	polls := 0 // the driver's Polls: only the goroutine holding the drive counts
	cq.afterEmpty = func() {
		if p := driven.Load(); p != nil && p.driving.Load() {
			if polls++; polls%(emptyPerDrive*spinPolls) == 0 {
				flag.Store(1)
			}
		}
	}
	p := mustNew(t, cq, nil, newCollector(1, 1), Config{Mode: Busy, noCrowdCut: true})
	driven.Store(p)
	const drives = 40
	for range drives {
		flag.Store(0)
		require.True(t, p.Drive(context.Background(), &flag))
	}
	assert.GreaterOrEqual(t, p.Stats().Yields, uint64(drives*emptyPerDrive/yieldDriveEvery),
		"%d drives of %d empty polls each", drives, emptyPerDrive)
}

// Rule: a Busy poller with a completion channel parks on it when
// goroutines wait for a P, and an event brings it back: nothing is lost.
func TestBusyParksWhenCrowded(t *testing.T) {
	stop := crowd(t, 1)
	ch := newFakeChan()
	ch.blocked = make(chan struct{}, 1)
	cq := newFakeCQ(64, ch)
	c := newCollector(1, 1)
	p := mustNew(t, cq, ch, c, Config{Mode: Busy})
	waitOrFail(t, ch.blocked, "the Busy poller parks while crowded", p)
	stop()
	require.True(t, cq.push1(0))
	waitOrFail(t, c.done, "the completion is handled", p)
	require.NoError(t, p.Close())
	c.exactlyOnce(t, 1)
	s := p.Stats()
	assert.GreaterOrEqual(t, s.SpinsCut, uint64(1))
	assert.GreaterOrEqual(t, s.Parks, uint64(1))
	assert.GreaterOrEqual(t, s.Events, uint64(1), "woken by the completion's event")
}

// Rule: a backlog of goroutines waiting for Ps (backlogPerP per P) makes
// a Busy poller an Adaptive one, and Wait not drive, until crowdHold has
// passed without one; then both are Busy again.
func TestBusyBacklog(t *testing.T) {
	stop := crowd(t, 2*backlogPerP)
	ch := newFakeChan()
	ch.blocked = make(chan struct{}, 1)
	cq := newFakeCQ(64, ch)
	h := newFlagger(2, 2)
	p, err := New(cq, ch, h, Config{Mode: Busy})
	require.NoError(t, err)
	p.holdFor = int64(time.Hour) // no slow machine ends it before the checks
	require.NoError(t, p.Start())
	defer p.Close()
	waitOrFail(t, ch.blocked, "the Busy poller parks under a backlog", p)
	require.NotZero(t, p.Stats().Backlogs)
	require.True(t, p.held())
	assert.False(t, p.Drive(context.Background(), &h.flags[0]), "Wait drove under a backlog")
	stop()

	// The poller is parked: the completion's event wakes it.
	require.True(t, cq.push1(0))
	require.True(t, spinUntil(func() bool { return h.flags[0].Load() != 0 }), "completion not handled: %+v", p.Stats())
	// Two holds later, as if the time had passed.
	at := p.crowdAt.Load()
	require.NotZero(t, at)
	p.crowdAt.CompareAndSwap(at, at-2*p.holdFor)
	require.False(t, p.held(), "the hold did not end")
	require.Zero(t, p.crowdAt.Load(), "an ended hold was not cleared")
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	drove := make(chan bool, 1)
	go func() { drove <- p.Drive(ctx, &h.flags[1]) }()
	require.True(t, spinUntil(func() bool { return p.Stats().Drives > 0 }), "Wait does not drive after the hold")
	require.True(t, cq.push1(1))
	// The drive ends with its completion, or earlier if goroutines
	// wait for a P (this test's among them); the poller handles it then.
	require.True(t, spinUntil(func() bool { return h.flags[1].Load() != 0 }), "completion not handled: %+v", p.Stats())
	assert.True(t, recvOrFail(t, drove, "Drive returns"))
	require.NoError(t, ctx.Err())
	require.NoError(t, p.Close())
	h.exactlyOnce(t, 2)
}
