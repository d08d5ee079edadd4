package poller

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdma/internal/verbs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bound is the longest any single wait of these tests may take. Nothing
// sleeps for synchronisation; bound only turns a hang into a failure.
const bound = 20 * time.Second

// collector records every WRID it sees. Only the poller goroutine calls
// Completions; the test reads seen after Close (Done orders the two).
type collector struct {
	seen   []uint32
	extra  int // WRIDs out of range
	badCap int // batches whose capacity exceeded their length
	maxLen int
	tids   map[int]int // OS threads the handler ran on

	total  atomic.Uint64
	target uint64
	once   sync.Once
	done   chan struct{}
}

func newCollector(n int, target uint64) *collector {
	return &collector{seen: make([]uint32, n), target: target, done: make(chan struct{})}
}

func (c *collector) Completions(wc []verbs.WorkCompletion) {
	for i := range wc {
		if id := wc[i].WRID; id < uint64(len(c.seen)) {
			c.seen[id]++
		} else {
			c.extra++
		}
	}
	if cap(wc) != len(wc) {
		c.badCap++
	}
	c.maxLen = max(c.maxLen, len(wc))
	if c.tids != nil {
		c.tids[threadID()]++
	}
	if c.total.Add(uint64(len(wc))) >= c.target {
		c.once.Do(func() { close(c.done) })
	}
}

// exactlyOnce checks that WRIDs 0..n-1 were each seen once.
func (c *collector) exactlyOnce(t *testing.T, n int) {
	t.Helper()
	bad := 0
	for id := 0; id < n; id++ {
		if c.seen[id] != 1 {
			if bad < 5 {
				t.Errorf("WRID %d handled %d times, want 1", id, c.seen[id])
			}
			bad++
		}
	}
	if bad > 0 || c.extra > 0 {
		t.Fatalf("%d WRIDs not handled exactly once, %d unknown WRIDs", bad, c.extra)
	}
}

func waitOrFail(t *testing.T, ch <-chan struct{}, what string, p *Poller) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(bound):
		s := ""
		if p != nil {
			s = fmt.Sprintf("; stats %+v", p.Stats())
		}
		t.Fatalf("%s: not within %v%s", what, bound, s)
	}
}

// spinUntil yields until cond holds and reports whether it did within
// bound.
func spinUntil(cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for i := 0; !cond(); i++ {
		if i%1024 == 0 && time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
	}
	return true
}

func mustNew(t *testing.T, cq verbs.CQ, ch verbs.CompChannel, h Handler, cfg Config) *Poller {
	t.Helper()
	p, err := New(cq, ch, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

var modes = []Mode{Busy, Adaptive, Event}

func TestNewValidates(t *testing.T) {
	ch := newFakeChan()
	cq := newFakeCQ(64, ch)
	h := HandlerFunc(func([]verbs.WorkCompletion) {})
	for _, tc := range []struct {
		name string
		cq   verbs.CQ
		ch   verbs.CompChannel
		h    Handler
		cfg  Config
	}{
		{"nil CQ", nil, ch, h, Config{}},
		{"nil handler", cq, ch, nil, Config{}},
		{"adaptive without channel", cq, nil, h, Config{}},
		{"event without channel", cq, nil, h, Config{Mode: Event}},
		{"unknown mode", cq, ch, h, Config{Mode: 9}},
		{"batch below 32", cq, ch, h, Config{Batch: 16}},
		{"batch above max", cq, ch, h, Config{Batch: MaxBatch + 1}},
		{"negative spin", cq, ch, h, Config{Spin: -time.Microsecond}},
	} {
		if _, err := New(tc.cq, tc.ch, tc.h, tc.cfg); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", tc.name, err)
		}
	}
	p, err := New(cq, nil, h, Config{Mode: Busy})
	if err != nil {
		t.Fatalf("busy without channel: %v", err)
	}
	p.Close()
	p, err = New(cq, ch, h, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := p.Config()
	if got.Mode != Adaptive || got.Batch != DefaultBatch || got.Spin != DefaultSpin {
		t.Errorf("zero Config resolved to %+v", got)
	}
}

func TestModeNames(t *testing.T) {
	for _, m := range modes {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseMode("spin"); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("ParseMode(spin): %v", err)
	}
	if s := Mode(7).String(); s != "Mode(7)" {
		t.Errorf("Mode(7) = %q", s)
	}
}

func TestLifecycle(t *testing.T) {
	h := HandlerFunc(func([]verbs.WorkCompletion) {})
	t.Run("close before start", func(t *testing.T) {
		ch := newFakeChan()
		p, _ := New(newFakeCQ(64, ch), ch, h, Config{})
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(); !errors.Is(err, ErrClosed) || !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Start after Close: %v", err)
		}
		waitOrFail(t, p.Done(), "Done after Close", p)
	})
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			ch := newFakeChan()
			p, _ := New(newFakeCQ(64, ch), ch, h, Config{Mode: m})
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			if err := p.Start(); err == nil {
				t.Fatal("second Start succeeded")
			}
			var wg sync.WaitGroup
			for range 4 { // concurrent Close calls all return nil once it has stopped
				wg.Go(func() {
					if err := p.Close(); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			waitOrFail(t, p.Done(), "Done after Close", p)
			if err := p.Err(); err != nil {
				t.Fatalf("Err after Close: %v", err)
			}
			if err := p.Start(); !errors.Is(err, ErrClosed) {
				t.Fatalf("Start after Close: %v", err)
			}
		})
	}
}

// TestCloseWakesParked closes pollers that are parked on their channel,
// through the Go-channel waker and through the netpoller waker.
func TestCloseWakesParked(t *testing.T) {
	for _, m := range []Mode{Adaptive, Event} {
		t.Run(m.String()+"/chan", func(t *testing.T) {
			ch := newFakeChan()
			ch.blocked = make(chan struct{}, 16)
			p := mustNew(t, newFakeCQ(64, ch), ch, newCollector(1, 1), Config{Mode: m, Spin: time.Microsecond})
			waitOrFail(t, ch.blocked, "poller parks", p)
			closed := make(chan struct{})
			go func() { p.Close(); close(closed) }()
			waitOrFail(t, closed, "Close of a parked poller", p)
			if s := p.Stats(); s.Wakeups != 1 || s.Parks != 1 {
				t.Fatalf("stats %+v, want 1 park and 1 wake-up", s)
			}
		})
		t.Run(m.String()+"/pipe", func(t *testing.T) {
			ch, err := newPipeChan()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			p := mustNew(t, newFakeCQ(64, ch), ch, newCollector(1, 1), Config{Mode: m, Spin: time.Microsecond})
			if !spinUntil(func() bool { return p.Stats().Parks > 0 }) {
				t.Fatalf("poller never parked: %+v", p.Stats())
			}
			closed := make(chan struct{})
			go func() { p.Close(); close(closed) }()
			waitOrFail(t, closed, "Close of a parked poller", p)
		})
	}
}

// TestDelivers pushes completions in batches of every size in every mode
// and with both wakers; each must reach the handler exactly once, in
// batches no larger than Batch and with no spare capacity.
func TestDelivers(t *testing.T) {
	const n = 20000
	for _, m := range modes {
		for _, wname := range []string{"chan", "pipe"} {
			t.Run(m.String()+"/"+wname, func(t *testing.T) {
				var ch waker
				if wname == "chan" {
					ch = newFakeChan()
				} else {
					pc, err := newPipeChan()
					if err != nil {
						t.Fatal(err)
					}
					defer pc.Close()
					ch = pc
				}
				cq := newFakeCQ(1024, ch)
				c := newCollector(n, n)
				p := mustNew(t, cq, ch, c, Config{Mode: m, Batch: 32, Spin: 2 * time.Microsecond})
				buf := make([]verbs.WorkCompletion, 100)
				for id, size := 0, 1; id < n; size = size%100 + 1 {
					k := min(size, n-id)
					for i := range k {
						buf[i] = verbs.WorkCompletion{WRID: uint64(id + i)}
					}
					if !spinUntil(func() bool { return cq.push(buf[:k]) }) {
						t.Fatalf("no room in the CQ; stats %+v", p.Stats())
					}
					id += k
					if size%10 == 0 {
						time.Sleep(10 * time.Microsecond) // pacing, so the poller parks between some batches
					}
				}
				waitOrFail(t, c.done, "all completions handled", p)
				p.Close()
				c.exactlyOnce(t, n)
				if c.badCap != 0 || c.maxLen > 32 {
					t.Fatalf("handler got %d batches with spare capacity, max batch %d (limit 32)", c.badCap, c.maxLen)
				}
				s := p.Stats()
				if s.Completions != n || s.MaxBatch > 32 || s.Polls < s.EmptyPolls+n/32 {
					t.Fatalf("stats %+v", s)
				}
				if m == Event && s.Arms == 0 { // Adaptive may never see the CQ idle for a whole spin
					t.Fatalf("%s poller never armed: %+v", m, s)
				}
				if got := cq.acked.Load(); uint64(got) != s.Events {
					t.Fatalf("acked %d events, stats say %d", got, s.Events)
				}
				t.Logf("%+v", s)
			})
		}
	}
}

// TestAdversarial pushes a completion from inside the CQ at each moment
// of the park sequence where one can be lost: after an empty poll, just
// before ReqNotify (no event will ever come for it), just after
// ReqNotify, and at AckEvents. The test drives rounds: it waits until the
// poller blocks on the channel, then pushes one completion, so every round
// goes event, ack, poll, arm, poll again, park. Every completion must be
// handled exactly once, and whenever the poller blocks the CQ must be
// armed and empty (the fake channel checks).
func TestAdversarial(t *testing.T) {
	const k = 1000        // injected completions, WRIDs 0..k-1
	const minRounds = 200 // test-pushed completions, WRIDs k...
	const maxRounds = 50000
	for _, m := range []Mode{Adaptive, Event} {
		for _, point := range []string{"afterEmpty", "beforeArm", "afterArm", "onAck"} {
			t.Run(m.String()+"/"+point, func(t *testing.T) {
				ch := newFakeChan()
				ch.blocked = make(chan struct{}, 1)
				cq := newFakeCQ(64, ch)
				var injected atomic.Uint64
				inject := func() { // on the poller goroutine only
					if n := injected.Load(); n < k && cq.push1(n) {
						injected.Store(n + 1)
					}
				}
				switch point {
				case "afterEmpty":
					cq.afterEmpty = inject
				case "beforeArm":
					cq.beforeArm = inject
				case "afterArm":
					cq.afterArm = inject
				case "onAck":
					cq.onAck = inject
				}
				c := newCollector(k+maxRounds, ^uint64(0))
				p := mustNew(t, cq, ch, c, Config{Mode: m, Spin: time.Microsecond})
				rounds := 0
				for ; rounds < minRounds || injected.Load() < k; rounds++ {
					if rounds == maxRounds {
						t.Fatalf("only %d of %d injections after %d rounds", injected.Load(), k, rounds)
					}
					waitOrFail(t, ch.blocked, "poller parks", p)
					cq.push1(uint64(k + rounds))
				}
				want := uint64(k + rounds)
				if !spinUntil(func() bool { return c.total.Load() >= want }) {
					t.Fatalf("%d of %d completions handled; stats %+v", c.total.Load(), want, p.Stats())
				}
				waitOrFail(t, ch.blocked, "poller parks after the last completion", p)
				p.Close()
				c.exactlyOnce(t, int(want))
				if lost := ch.lost.Load(); lost != 0 {
					t.Fatalf("the poller blocked %d times with an unannounced completion in the CQ", lost)
				}
				s := p.Stats()
				if uint64(cq.acked.Load()) != ch.delivered.Load() || s.Events != ch.delivered.Load() {
					t.Fatalf("events delivered %d, acked %d, counted %d", ch.delivered.Load(), cq.acked.Load(), s.Events)
				}
				if point == "beforeArm" && s.Repolled < k {
					t.Fatalf("poll after arming found %d completions, want at least %d", s.Repolled, k)
				}
				t.Logf("%d rounds; %+v", rounds, s)
			})
		}
	}
}

// TestAdversarialCatchesMissingRepoll is the mutation check of
// TestAdversarial: without the poll after ReqNotify, a completion pushed
// just before arming is left in the CQ while the poller sleeps.
func TestAdversarialCatchesMissingRepoll(t *testing.T) {
	for _, m := range []Mode{Adaptive, Event} {
		t.Run(m.String(), func(t *testing.T) {
			ch := newFakeChan()
			ch.blocked = make(chan struct{}, 1)
			cq := newFakeCQ(64, ch)
			done := false
			cq.beforeArm = func() {
				if !done {
					done = true
					cq.push1(0)
				}
			}
			p := mustNew(t, cq, ch, newCollector(1, 1), Config{Mode: m, Spin: time.Microsecond, noRepoll: true})
			waitOrFail(t, ch.blocked, "poller parks", p)
			p.Close()
			if ch.lost.Load() == 0 || cq.avail.Load() != 1 {
				t.Fatalf("lost %d, left in CQ %d: the test did not catch the missing poll", ch.lost.Load(), cq.avail.Load())
			}
		})
	}
}

// TestConcurrentProducers has many goroutines push completions with
// unique WRIDs, in random batches and at random paces, while the CQ also
// injects completions at the adversarial moments; the counts must match
// exactly.
func TestConcurrentProducers(t *testing.T) {
	const producers, per = 8, 10000
	const injected = 5000
	const total = producers*per + injected
	for _, m := range modes {
		for _, wname := range []string{"chan", "pipe"} {
			if m == Busy && wname == "pipe" {
				continue
			}
			t.Run(m.String()+"/"+wname, func(t *testing.T) {
				var ch waker
				var fc *fakeChan
				if wname == "chan" {
					fc = newFakeChan()
					ch = fc
				} else {
					pc, err := newPipeChan()
					if err != nil {
						t.Fatal(err)
					}
					defer pc.Close()
					ch = pc
				}
				cq := newFakeCQ(512, ch)
				// The injector runs on the poller goroutine only.
				next := uint64(producers * per)
				rnd := uint64(0x9e3779b97f4a7c15)
				chance := func(n uint64) bool {
					rnd ^= rnd << 13
					rnd ^= rnd >> 7
					rnd ^= rnd << 17
					return rnd%n == 0
				}
				inject := func() {
					if next < total && chance(4) && cq.push1(next) {
						next++
					}
				}
				cq.beforeArm = inject
				cq.afterArm = inject
				cq.onAck = inject
				cq.afterEmpty = func() {
					if chance(64) {
						inject()
					}
				}
				c := newCollector(total, total)
				p := mustNew(t, cq, ch, c, Config{Mode: m, Batch: 32, Spin: 3 * time.Microsecond})
				var wg sync.WaitGroup
				for g := range producers {
					wg.Go(func() {
						buf := make([]verbs.WorkCompletion, 64)
						x := uint64(g)*7919 + 1
						for id := g * per; id < (g+1)*per; {
							x = x*6364136223846793005 + 1442695040888963407
							k := min(int(x>>58)+1, (g+1)*per-id)
							for i := range k {
								buf[i] = verbs.WorkCompletion{WRID: uint64(id + i)}
							}
							if !spinUntil(func() bool { return cq.push(buf[:k]) }) {
								t.Errorf("no room in the CQ; stats %+v", p.Stats())
								return
							}
							id += k
							switch x >> 60 {
							case 0:
								time.Sleep(time.Duration(x>>40&63) * time.Microsecond) // pacing only
							case 1, 2:
								runtime.Gosched()
							}
						}
					})
				}
				wg.Wait()
				if t.Failed() {
					return
				}
				// The injector needs the poller to keep cycling until it has
				// injected its share: kick it round.
				deadline := time.Now().Add(bound)
				for c.total.Load() < total && time.Now().Before(deadline) {
					p.Kick()
					runtime.Gosched()
				}
				waitOrFail(t, c.done, "all completions handled", p)
				p.Close()
				c.exactlyOnce(t, total)
				if fc != nil && fc.lost.Load() != 0 {
					t.Fatalf("the poller blocked %d times with an unannounced completion", fc.lost.Load())
				}
				s := p.Stats()
				if s.Completions != total || uint64(cq.acked.Load()) != s.Events {
					t.Fatalf("stats %+v, acked %d", s, cq.acked.Load())
				}
				t.Logf("%+v", s)
			})
		}
	}
}

func TestKick(t *testing.T) {
	for _, m := range []Mode{Adaptive, Event} {
		t.Run(m.String(), func(t *testing.T) {
			ch := newFakeChan()
			ch.blocked = make(chan struct{}, 1)
			p := mustNew(t, newFakeCQ(64, ch), ch, newCollector(1, 1), Config{Mode: m, Spin: time.Microsecond})
			waitOrFail(t, ch.blocked, "poller parks", p)
			p.Kick()
			waitOrFail(t, ch.blocked, "poller parks again after the kick", p)
			s := p.Stats()
			if s.Kicks != 1 || s.Wakeups != 1 || s.Parks != 2 || s.Arms != 2 || s.Events != 0 {
				t.Fatalf("stats %+v, want 1 kick, 1 wake-up, 2 parks and 2 arms", s)
			}
		})
	}
	t.Run("busy", func(t *testing.T) {
		p := mustNew(t, newFakeCQ(64, nil), nil, newCollector(1, 1), Config{Mode: Busy})
		p.Kick()
		p.Close()
		if s := p.Stats(); s.Kicks != 0 || s.Parks != 0 {
			t.Fatalf("busy poller parked: %+v", s)
		}
	})
}

// TestKickWhileSpinning checks that a Kick that finds an Adaptive poller
// spinning is not lost: it buys one more spin instead of a wake-up.
func TestKickWhileSpinning(t *testing.T) {
	ch := newFakeChan()
	ch.blocked = make(chan struct{}, 1)
	cq := newFakeCQ(64, ch)
	var p *Poller
	kicked := false
	cq.afterEmpty = func() { // runs on the poller, while it spins
		if !kicked {
			kicked = true
			p.Kick()
		}
	}
	p, _ = New(cq, ch, newCollector(1, 1), Config{Spin: time.Microsecond})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitOrFail(t, ch.blocked, "poller parks", p)
	if s := p.Stats(); s.Parks != 1 || s.Kicks != 0 || s.Wakeups != 0 || p.kick.Load() {
		t.Fatalf("stats %+v, kick pending %v", s, p.kick.Load())
	}
}

func TestPollErrorStops(t *testing.T) {
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			ch := newFakeChan()
			cq := newFakeCQ(64, ch)
			boom := errors.New("poll failed")
			cq.pollErr, cq.errAt = boom, 3
			cq.push1(0)
			cq.push1(1)
			cq.push1(2)
			c := newCollector(3, 3)
			p := mustNew(t, cq, ch, c, Config{Mode: m, Batch: 32})
			waitOrFail(t, p.Done(), "poller stops on error", p)
			if err := p.Err(); !errors.Is(err, boom) {
				t.Fatalf("Err = %v", err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if c.total.Load() != 3 {
				t.Fatalf("handled %d of 3 completions before the error", c.total.Load())
			}
		})
	}
}

func TestSharedChannelDetected(t *testing.T) {
	ch := newFakeChan()
	ch.blocked = make(chan struct{}, 1)
	cq := newFakeCQ(64, ch)
	other := newFakeCQ(64, nil)
	p := mustNew(t, cq, ch, newCollector(1, 1), Config{Mode: Event})
	waitOrFail(t, ch.blocked, "poller parks", p)
	ch.post(other)
	waitOrFail(t, p.Done(), "poller stops", p)
	if err := p.Err(); !errors.Is(err, ErrSharedChannel) {
		t.Fatalf("Err = %v", err)
	}
	if other.acked.Load() != 1 || cq.acked.Load() != 0 {
		t.Fatalf("acked: other CQ %d, own CQ %d; want the event acked on the CQ it named", other.acked.Load(), cq.acked.Load())
	}
}

func TestChannelClosedStops(t *testing.T) {
	ch := newFakeChan()
	ch.blocked = make(chan struct{}, 1)
	p := mustNew(t, newFakeCQ(64, ch), ch, newCollector(1, 1), Config{Mode: Event})
	waitOrFail(t, ch.blocked, "poller parks", p)
	ch.Close()
	waitOrFail(t, p.Done(), "poller stops", p)
	if err := p.Err(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Err = %v, want one wrapping net.ErrClosed", err)
	}
}

// TestLockedThread checks that the handler of a locked poller always runs
// on the same OS thread, across parks and wake-ups.
func TestLockedThread(t *testing.T) {
	if threadID() == 0 {
		t.Skip("no thread IDs on this OS")
	}
	ch := newFakeChan()
	ch.blocked = make(chan struct{}, 1)
	cq := newFakeCQ(64, ch)
	const n = 50
	c := newCollector(n, n)
	c.tids = map[int]int{}
	p := mustNew(t, cq, ch, c, Config{Mode: Event, Lock: LockAlways})
	for i := range n {
		waitOrFail(t, ch.blocked, "poller parks", p)
		cq.push1(uint64(i))
	}
	waitOrFail(t, c.done, "all handled", p)
	p.Close()
	if len(c.tids) != 1 {
		t.Fatalf("handler ran on %d OS threads: %v", len(c.tids), c.tids)
	}
}

// TestSteadyStateNoAllocs runs each mode for thousands of batches and
// counts heap allocations in the whole process: polling and dispatch
// allocate nothing per batch.
func TestSteadyStateNoAllocs(t *testing.T) {
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			ch := newFakeChan()
			cq := newFakeCQ(1024, ch)
			c := newCollector(0, ^uint64(0))
			p := mustNew(t, cq, ch, c, Config{Mode: m})
			batch := make([]verbs.WorkCompletion, DefaultBatch)
			round := func(rounds int) {
				for range rounds {
					want := c.total.Load() + DefaultBatch
					if !spinUntil(func() bool { return cq.push(batch) }) ||
						!spinUntil(func() bool { return c.total.Load() >= want }) {
						t.Fatalf("batch not handled; stats %+v", p.Stats())
					}
				}
			}
			round(200) // warm up: first park, first event, lazily made channels
			const rounds = 5000
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			round(rounds)
			runtime.ReadMemStats(&after)
			allocs := after.Mallocs - before.Mallocs
			t.Logf("%d allocations in %d batches of %d; %+v", allocs, rounds, DefaultBatch, p.Stats())
			if allocs*10 > rounds { // far below one per batch; ideally 0
				t.Fatalf("%d allocations in %d batches", allocs, rounds)
			}
		})
	}
}

// TestPollAllocs measures one poll-and-dispatch step directly.
func TestPollAllocs(t *testing.T) {
	cq := newFakeCQ(1024, nil)
	c := newCollector(0, ^uint64(0))
	p, _ := New(cq, nil, c, Config{Mode: Busy})
	defer p.Close()
	batch := make([]verbs.WorkCompletion, DefaultBatch)
	var ls loopState
	allocs := testing.AllocsPerRun(1000, func() {
		cq.push(batch)
		if n, _ := p.poll(&ls, spinPolls); n != DefaultBatch {
			t.Fatalf("polled %d", n)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per batch", allocs)
	}
}

// TestIdleYield checks the one yield a spinning poller makes when the CQ
// runs dry after a burst, and that NoIdleYield turns it off.
func TestIdleYield(t *testing.T) {
	for _, noIdle := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoIdleYield=%v", noIdle), func(t *testing.T) {
			cq := newFakeCQ(64, nil)
			c := newCollector(1, 1)
			cq.push1(0)
			p := mustNew(t, cq, nil, c, Config{Mode: Busy, YieldEvery: -1, NoIdleYield: noIdle})
			waitOrFail(t, c.done, "completion handled", p)
			want := uint64(1)
			if noIdle {
				want = 0
			}
			// The yield follows the first empty poll after the batch.
			if !spinUntil(func() bool { return p.Stats().EmptyPolls >= 2*flushEvery }) {
				t.Fatalf("poller stopped polling: %+v", p.Stats())
			}
			p.Close()
			if s := p.Stats(); s.Yields != want {
				t.Fatalf("%d yields, want %d: %+v", s.Yields, want, s)
			}
		})
	}
}

// TestYieldEveryAuto checks that a Busy poller yields regularly while
// GOMAXPROCS is 1 and never otherwise.
func TestYieldEveryAuto(t *testing.T) {
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			p := mustNew(t, newFakeCQ(64, nil), nil, newCollector(1, 1), Config{Mode: Busy, NoIdleYield: true})
			if !spinUntil(func() bool { return p.Stats().EmptyPolls >= 64*autoYieldEvery }) {
				t.Fatalf("poller stopped polling: %+v", p.Stats())
			}
			p.Close()
			s := p.Stats()
			if procs == 1 && s.Yields < s.EmptyPolls/autoYieldEvery-1 {
				t.Fatalf("%d yields in %d empty polls at GOMAXPROCS 1", s.Yields, s.EmptyPolls)
			}
			if procs > 1 && s.Yields != 0 {
				t.Fatalf("%d yields at GOMAXPROCS %d", s.Yields, procs)
			}
		})
	}
}

// TestThreadLock checks which pollers lock their thread: by default only
// Busy ones.
func TestThreadLock(t *testing.T) {
	for _, tc := range []struct {
		l    ThreadLock
		m    Mode
		want bool
	}{
		{LockAuto, Busy, true}, {LockAuto, Adaptive, false}, {LockAuto, Event, false},
		{LockAlways, Adaptive, true}, {LockAlways, Event, true},
		{LockNever, Busy, false},
	} {
		if got := tc.l.locked(tc.m); got != tc.want {
			t.Errorf("%s.locked(%s) = %v, want %v", tc.l, tc.m, got, tc.want)
		}
	}
	ch := newFakeChan()
	if _, err := New(newFakeCQ(64, ch), ch, HandlerFunc(func([]verbs.WorkCompletion) {}), Config{Lock: LockNever + 1}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("New with Lock %d: %v, want ErrInvalid", LockNever+1, err)
	}
}

// longSpinPoller starts an Adaptive poller that would spin for an hour,
// on a fake CQ whose channel reports each park on ch.blocked, handing
// its completions to a collector expecting n.
func longSpinPoller(t *testing.T, n int) (*Poller, *fakeCQ, *fakeChan, *collector) {
	ch := newFakeChan()
	ch.blocked = make(chan struct{}, 1)
	cq := newFakeCQ(64, ch)
	c := newCollector(n, uint64(n))
	return mustNew(t, cq, ch, c, Config{Spin: time.Hour}), cq, ch, c
}

// TestSpinLimit: at GOMAXPROCS 2 one Adaptive poller spins at a time.
// With the slot taken, another parks at once, like an Event poller, and
// still hands over every completion; a poller that spun gives its slot
// back when it stops.
func TestSpinLimit(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	if n := spinners.Load(); n != 0 {
		t.Fatalf("%d pollers spinning before the test", n)
	}
	spinners.Store(maxSpinners()) // as if other pollers spun
	const n = 20
	p, cq, ch, c := longSpinPoller(t, n)
	for i := range n {
		waitOrFail(t, ch.blocked, "poller parks", p)
		cq.push1(uint64(i))
	}
	waitOrFail(t, c.done, "all handled", p)
	p.Close()
	c.exactlyOnce(t, n)
	if st := p.Stats(); st.SpinsDenied < n || st.Parks < n {
		t.Errorf("%d spins denied and %d parks, want at least %d each", st.SpinsDenied, st.Parks, n)
	}
	if got, want := spinners.Load(), maxSpinners(); got != want {
		t.Fatalf("%d pollers counted as spinning after a denied one stopped, want %d", got, want)
	}
	spinners.Store(0)

	ch = newFakeChan()
	p = mustNew(t, newFakeCQ(64, ch), ch, newCollector(0, 0), Config{Spin: time.Hour})
	// Poll for the spin with the test goroutine asleep: a runnable one
	// would cut the spin short (TestSpinCrowded). Kick makes a poller
	// whose spin was cut anyway spin again.
	for deadline := time.Now().Add(bound); spinners.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("poller does not spin; stats %+v", p.Stats())
		}
		p.Kick()
	}
	p.Close()
	if got := spinners.Load(); got != 0 {
		t.Errorf("%d pollers counted as spinning after Close", got)
	}
}

// TestKickWithoutSpinSlot: a Kick leaves a parked Adaptive poller parked
// while it could not spin; the completion's event still wakes it, and a
// Kick wakes it again once a spin slot is free.
func TestKickWithoutSpinSlot(t *testing.T) {
	if n := spinners.Load(); n != 0 {
		t.Fatalf("%d pollers spinning before the test", n)
	}
	spinners.Store(spinLimit.Load())        // as if other pollers spun
	t.Cleanup(func() { spinners.Store(0) }) // after the poller's Close
	p, cq, ch, c := longSpinPoller(t, 1)
	waitOrFail(t, ch.blocked, "poller parks", p)
	p.Kick()
	if st := p.Stats(); st.KicksSkipped != 1 || st.Kicks != 0 {
		t.Fatalf("kick with no spin slot: %d skipped, %d woke, want 1 and 0", st.KicksSkipped, st.Kicks)
	}
	cq.push1(0)
	waitOrFail(t, c.done, "completion handled", p)
	waitOrFail(t, ch.blocked, "poller parks again", p)
	spinners.Store(0)
	p.Kick()
	if st := p.Stats(); st.Kicks != 1 {
		t.Fatalf("kick with a spin slot free: %d woke, want 1", st.Kicks)
	}
	p.Close()
	if n := spinners.Load(); n != 0 {
		t.Errorf("%d pollers counted as spinning after Close", n)
	}
}

// TestSpinCrowded: an Adaptive poller stops spinning, long before its
// Spin, while goroutines wait for a P, and parks.
func TestSpinCrowded(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := make(chan struct{})
	defer close(stop)
	go func() { // always runnable
		for {
			select {
			case <-stop:
				return
			default:
				runtime.Gosched()
			}
		}
	}()
	p, cq, ch, c := longSpinPoller(t, 1)
	waitOrFail(t, ch.blocked, "poller parks", p)
	if st := p.Stats(); st.SpinsCut == 0 {
		t.Errorf("poller parked with no spin cut: %+v", st)
	}
	cq.push1(0)
	waitOrFail(t, c.done, "completion handled", p)
}

// TestUnlocked runs the poller on an ordinary goroutine: everything but
// the thread pinning behaves the same.
func TestUnlocked(t *testing.T) {
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			ch := newFakeChan()
			cq := newFakeCQ(64, ch)
			const n = 500
			c := newCollector(n, n)
			p := mustNew(t, cq, ch, c, Config{Mode: m, Lock: LockNever, Spin: time.Microsecond})
			for i := range n {
				if !spinUntil(func() bool { return cq.push1(uint64(i)) }) {
					t.Fatalf("no room in the CQ; stats %+v", p.Stats())
				}
			}
			waitOrFail(t, c.done, "all handled", p)
			p.Close()
			c.exactlyOnce(t, n)
		})
	}
}
