package poller

import (
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The benchmarks use the pure-Go fake CQ with either waker: "chan" parks
// the poller on a Go channel, "pipe" on a pipe fd through the netpoller,
// as the verbs provider's completion channel does. Latencies are reported
// as metrics in microseconds (p50-µs, p99-µs, ...); ns/op is the time of
// a whole iteration including the gaps and means little.
//
//	go test -run '^$' -bench . -benchtime 3000x ./poller/

// latencies collects samples and reports percentiles.
type latencies []int64

func (l latencies) report(b *testing.B, name string) {
	if len(l) == 0 {
		return
	}
	s := slices.Clone(l)
	slices.Sort(s)
	pct := func(p float64) float64 {
		i := int(p * float64(len(s)-1))
		return float64(s[i]) / 1e3
	}
	var sum int64
	for _, v := range s {
		sum += v
	}
	b.ReportMetric(pct(0.50), name+"p50-µs")
	b.ReportMetric(pct(0.90), name+"p90-µs")
	b.ReportMetric(pct(0.99), name+"p99-µs")
	b.ReportMetric(float64(sum)/float64(len(s))/1e3, name+"mean-µs")
}

func benchWaker(b *testing.B, name string) waker {
	if name == "chan" {
		return newFakeChan()
	}
	pc, err := newPipeChan()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pc.Close() })
	return pc
}

type benchCase struct {
	name string
	cfg  Config
}

var benchModes = []benchCase{
	{"busy", Config{Mode: Busy}},
	{"adaptive", Config{Mode: Adaptive}},
	{"event", Config{Mode: Event}},
	{"adaptive-locked", Config{Mode: Adaptive, Lock: LockAlways}},
	{"event-locked", Config{Mode: Event, Lock: LockAlways}},
}

// BenchmarkDispatch is the throughput of poll and dispatch: a producer
// pushes batches of 64 and the handler counts. One op is one completion;
// allocs/op must be 0.
func BenchmarkDispatch(b *testing.B) {
	for _, bc := range benchModes {
		b.Run(bc.name, func(b *testing.B) {
			ch := newFakeChan()
			cq := newFakeCQ(4096, ch)
			var got atomic.Uint64
			p, err := New(cq, ch, HandlerFunc(func(wc []verbs.WorkCompletion) { got.Add(uint64(len(wc))) }), bc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Start(); err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			batch := make([]verbs.WorkCompletion, 64)
			b.ReportAllocs()
			b.ResetTimer()
			for sent := 0; sent < b.N; {
				k := min(64, b.N-sent)
				for !cq.push(batch[:k]) {
					runtime.Gosched()
				}
				sent += k
			}
			for got.Load() < uint64(b.N) {
				runtime.Gosched()
			}
			b.StopTimer()
			s := p.Stats()
			b.ReportMetric(float64(s.Completions)/float64(max(1, s.Polls-s.EmptyPolls)), "wc/batch")
		})
	}
}

// BenchmarkWakeLatency measures from "a completion appears in the CQ" to
// "the handler has it". The device is the benchmark goroutine itself: it
// spins (like hardware, it never parks), waits gap, stamps the time into
// the WRID and pushes, then spins until the handler has seen it. With a
// gap shorter than the spin the adaptive poller is still spinning; with a
// longer one it has parked.
func BenchmarkWakeLatency(b *testing.B) {
	for _, bc := range benchModes {
		for _, wname := range []string{"chan", "pipe"} {
			if bc.cfg.Mode == Busy && wname == "pipe" {
				continue
			}
			for _, gap := range []time.Duration{0, 10 * time.Microsecond, 200 * time.Microsecond} {
				b.Run(fmt.Sprintf("%s/%s/gap=%v", bc.name, wname, gap), func(b *testing.B) {
					benchWake(b, bc.cfg, wname, gap)
				})
			}
		}
	}
}

func benchWake(b *testing.B, cfg Config, wname string, gap time.Duration) {
	ch := benchWaker(b, wname)
	cq := newFakeCQ(64, ch)
	lat := make(latencies, b.N)
	var handled atomic.Int64
	h := HandlerFunc(func(wc []verbs.WorkCompletion) {
		now := nanotime()
		for i := range wc {
			lat[handled.Load()] = now - int64(wc[i].WRID)
			handled.Add(1)
		}
	})
	p, err := New(cq, ch, h, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var wc [1]verbs.WorkCompletion
	b.ResetTimer()
	for i := range b.N {
		for end := nanotime() + gap.Nanoseconds(); nanotime() < end; {
		}
		wc[0].WRID = uint64(nanotime())
		cq.push(wc[:])
		for handled.Load() <= int64(i) {
		}
	}
	b.StopTimer()
	p.Close()
	lat.report(b, "")
	s := p.Stats()
	b.ReportMetric(float64(s.Parks)/float64(b.N), "parks/op")
}

// BenchmarkFutureWake is the path an application sees: a goroutine waits
// on a future (a channel) that the handler closes. A device goroutine
// completes each operation after a timer (so the waiter has parked and
// the device holds no P while it waits). Metrics: poll- (completion to
// handler), wake- (handler to the waiting goroutine running), e2e-
// (completion to waiter). GOMAXPROCS is set per case: on this 2-core
// machine a Busy poller holds one of the Ps for good.
func BenchmarkFutureWake(b *testing.B) {
	cases := []benchCase{
		{"busy-noyield", Config{Mode: Busy, YieldEvery: -1, NoIdleYield: true}},
		{"busy-yield1024", Config{Mode: Busy, YieldEvery: 1024, NoIdleYield: true}},
		{"busy", Config{Mode: Busy}},
		{"busy-unlocked", Config{Mode: Busy, Lock: LockNever}},
		{"adaptive-locked-noyield", Config{Mode: Adaptive, Lock: LockAlways, YieldEvery: -1, NoIdleYield: true}},
		{"adaptive-locked", Config{Mode: Adaptive, Lock: LockAlways}},
		{"adaptive", Config{Mode: Adaptive}},
		{"event-locked", Config{Mode: Event, Lock: LockAlways}},
		{"event", Config{Mode: Event}},
	}
	for _, procs := range []int{1, 2} {
		for _, bc := range cases {
			b.Run(fmt.Sprintf("procs=%d/%s", procs, bc.name), func(b *testing.B) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				benchFuture(b, bc.cfg, 20*time.Microsecond)
			})
		}
	}
}

func benchFuture(b *testing.B, cfg Config, delay time.Duration) {
	ch := benchWaker(b, "pipe")
	cq := newFakeCQ(64, ch)
	futures := make([]chan struct{}, b.N)
	for i := range futures {
		futures[i] = make(chan struct{})
	}
	pushed := make([]int64, b.N)  // device: completion in the CQ
	handled := make([]int64, b.N) // handler: future completed
	h := HandlerFunc(func(wc []verbs.WorkCompletion) {
		now := nanotime()
		for i := range wc {
			id := wc[i].WRID
			handled[id] = now
			close(futures[id])
		}
	})
	p, err := New(cq, ch, h, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	req := make(chan int)
	devDone := make(chan struct{})
	go func() { // the device
		defer close(devDone)
		var wc [1]verbs.WorkCompletion
		for i := range req {
			time.Sleep(delay)
			wc[0].WRID = uint64(i)
			pushed[i] = nanotime()
			cq.push(wc[:])
		}
	}()
	pollLat := make(latencies, b.N)
	wakeLat := make(latencies, b.N)
	e2e := make(latencies, b.N)
	b.ResetTimer()
	for i := range b.N {
		req <- i
		<-futures[i]
		now := nanotime()
		pollLat[i] = handled[i] - pushed[i]
		wakeLat[i] = now - handled[i]
		e2e[i] = now - pushed[i]
	}
	b.StopTimer()
	close(req)
	<-devDone
	p.Close()
	pollLat.report(b, "poll-")
	wakeLat.report(b, "wake-")
	e2e.report(b, "e2e-")
	s := p.Stats()
	b.ReportMetric(float64(s.Yields)/float64(b.N), "yields/op")
	b.ReportMetric(float64(s.Parks)/float64(b.N), "parks/op")
}

// BenchmarkSpinSweep chooses the default spin: the wake latency of an
// Adaptive poller (pipe waker, like the verbs provider) for completions
// that arrive gap after the previous one, for several spins. A gap below
// the spin costs spin-gap of CPU and no park; a gap above it costs a park
// and the whole spin.
func BenchmarkSpinSweep(b *testing.B) {
	for _, spin := range []time.Duration{10 * time.Microsecond, 25 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond} {
		for _, gap := range []time.Duration{5 * time.Microsecond, 20 * time.Microsecond, 40 * time.Microsecond, 80 * time.Microsecond} {
			b.Run(fmt.Sprintf("spin=%v/gap=%v", spin, gap), func(b *testing.B) {
				benchWake(b, Config{Mode: Adaptive, Spin: spin}, "pipe", gap)
			})
		}
	}
}

// BenchmarkLockedPark is the cost of parking and waking a goroutine that
// is locked to its OS thread, against an unlocked one: a ping-pong over
// two unbuffered channels, one op is one round trip (two wakes).
func BenchmarkLockedPark(b *testing.B) {
	for _, locked := range []bool{false, true} {
		b.Run(fmt.Sprintf("locked=%v", locked), func(b *testing.B) {
			ping, pong := make(chan struct{}), make(chan struct{})
			go func() {
				if locked {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
				}
				for range ping {
					pong <- struct{}{}
				}
				close(pong)
			}()
			b.ResetTimer()
			for range b.N {
				ping <- struct{}{}
				<-pong
			}
			b.StopTimer()
			close(ping)
			<-pong
		})
	}
}

// BenchmarkKick is the cost of Kick on a poller that is spinning (the
// common case: two atomic operations).
func BenchmarkKick(b *testing.B) {
	ch := newFakeChan()
	p, err := New(newFakeCQ(64, ch), ch, HandlerFunc(func([]verbs.WorkCompletion) {}), Config{Spin: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	b.ReportAllocs()
	for b.Loop() {
		p.Kick()
	}
}

// BenchmarkSchedProbe: one read of the scheduler's counters, what a
// spinner pays every clockEvery empty polls (loop.go), and the spin
// clock's read beside it.
func BenchmarkSchedProbe(b *testing.B) {
	b.Run("probe", func(b *testing.B) {
		var s schedProbe
		for b.Loop() {
			s.load()
		}
	})
	b.Run("clock", func(b *testing.B) {
		for b.Loop() {
			nanotime()
		}
	})
}
