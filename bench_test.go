package rdma_test

// Benchmarks of the async API against the raw provider path, in one run.
// They are the quick regression check; cmd/rdmaperf and test/perf are the
// comparison with perftest (docs/performance.md).
//
// Compare two versions with benchstat (go install
// golang.org/x/perf/cmd/benchstat@latest): run the same command on each,
// at least 6 counts so that benchstat can tell noise from change:
//
//	git stash; go test -run '^$' -bench . -benchtime 2000x -count 6 . > old.txt
//	git stash pop; go test -run '^$' -bench . -benchtime 2000x -count 6 . > new.txt
//	benchstat old.txt new.txt
//
// Every benchmark reports allocs/op and B/op, Gb/s and Mops/s; the queue
// depth 1 ones and BenchmarkPingPong also report the median and 99th
// percentile latency of one operation (p50-us, p99-us) and the share of
// operations slower than 4× the median (slow-%).
//
// RDMA_BENCH_PROVIDER=soft|verbs chooses the provider (default soft),
// RDMA_BENCH_POLL=adaptive|busy|event the poll mode. The
// raw path posts and polls the provider's verbs directly, with no futures
// and no pool; the ratio future/raw is the API's overhead per operation.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/soft"
	"github.com/go-rdma/rdma/internal/verbs"
	"github.com/go-rdma/rdma/rdmatest"
)

var benchSizes = []int{8, 4 << 10, 64 << 10, 1 << 20}

func benchProvider() string {
	if p := os.Getenv("RDMA_BENCH_PROVIDER"); p != "" {
		return p
	}
	return rdma.ProviderSoft
}

// benchOptions are the provider and, if RDMA_BENCH_POLL names one, the
// poll mode the benchmarks use.
func benchOptions() []rdma.Option {
	opts := []rdma.Option{rdma.WithProvider(benchProvider())}
	if m := os.Getenv("RDMA_BENCH_POLL"); m != "" {
		mode, err := rdma.ParsePollMode(m)
		if err != nil {
			panic(err)
		}
		opts = append(opts, rdma.WithPollMode(mode))
	}
	return opts
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func report(b *testing.B, size int, el time.Duration) {
	b.ReportMetric(float64(b.N)*float64(size)*8/el.Seconds()/1e9, "Gb/s")
	b.ReportMetric(float64(b.N)/el.Seconds()/1e6, "Mops/s")
}

// latencies records one duration per operation in memory allocated
// before the timer starts, and reports the median and the 99th
// percentile in µs.
type latencies struct {
	d    []time.Duration
	last time.Time
}

func newLatencies(n int) *latencies { return &latencies{d: make([]time.Duration, 0, n)} }

// start marks the beginning of an operation; stop records it.
func (l *latencies) start() { l.last = time.Now() }
func (l *latencies) stop()  { l.d = append(l.d, time.Since(l.last)) }

func (l *latencies) report(b *testing.B) {
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	at := func(q float64) float64 {
		return float64(l.d[min(len(l.d)-1, int(q*float64(len(l.d))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(at(0.50), "p50-us")
	b.ReportMetric(at(0.99), "p99-us")
	// The share of operations slower than 4× the median: steadier than
	// the p99 where the slow ones are about 1 % (the 64 KiB queue-depth-1
	// WRITE on soft, docs/performance.md), whose p99 then jumps between
	// the fast and the slow ones from run to run.
	slow := len(l.d) - sort.Search(len(l.d), func(i int) bool { return l.d[i] > 4*l.d[len(l.d)/2] })
	b.ReportMetric(100*float64(slow)/float64(len(l.d)), "slow-%")
}

// benchPair connects a pair through the package-level Listen and Dial,
// so both ends share the process's engine (one pool, one set of pollers),
// unlike rdmatest.Pair's engine per end: what docs/async.md and
// docs/performance.md measured, and what benchstat compares across
// commits.
func benchPair(b *testing.B, maxMsg int, extra ...rdma.Option) (c, s *rdma.Conn) {
	b.Helper()
	opts := append(benchOptions(), rdma.WithMaxMessage(maxMsg), rdma.WithQueueDepth(128, 128))
	opts = append(opts, extra...)
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(b, err)
	defer ln.Close()
	return rdmatest.Connect(b, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", address, opts...)
	})
}

// BenchmarkAllocRelease: a 64 B buffer from the pool and back, what
// every Buffer handle costs on its own (the pool, the handle, its GC
// safety net).
func BenchmarkAllocRelease(b *testing.B) {
	c, _ := benchPair(b, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf, err := c.Alloc(64)
		if err != nil {
			b.Fatal(err)
		}
		buf.Release()
	}
}

// BenchmarkWrite: RDMA WRITE through futures, batches and the raw path.
func BenchmarkWrite(b *testing.B) { benchOneSided(b, false) }

// BenchmarkRead: RDMA READ through futures, batches and the raw path.
func BenchmarkRead(b *testing.B) { benchOneSided(b, true) }

func benchOneSided(b *testing.B, read bool) {
	for _, size := range benchSizes {
		for _, qd := range []int{1, 64} {
			b.Run(fmt.Sprintf("future/%s/qd%d", sizeName(size), qd), func(b *testing.B) {
				c, s := benchPair(b, 64<<10)
				target, _ := s.Alloc(size)
				defer target.Release()
				region, err := s.Expose(target, rdma.RemoteRead|rdma.RemoteWrite)
				if err != nil {
					b.Fatal(err)
				}
				buf, _ := c.Alloc(size)
				defer buf.Release()
				ctx := context.Background()
				window := make([]*rdma.Future, qd)
				lat := newLatencies(b.N)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				for i := 0; i < b.N+qd; i++ {
					slot := i % qd
					if f := window[slot]; f != nil {
						if err := f.Wait(ctx); err != nil {
							b.Fatal(err)
						}
						f.Release()
						window[slot] = nil
						if qd == 1 {
							lat.stop()
						}
					}
					if i < b.N {
						if qd == 1 {
							lat.start()
						}
						if read {
							window[slot] = c.Read(buf, region)
						} else {
							window[slot] = c.Write(buf, region)
						}
					}
				}
				report(b, size, time.Since(start))
				lat.report(b)
			})
			if qd > 1 {
				b.Run(fmt.Sprintf("batch/%s/qd%d", sizeName(size), qd), func(b *testing.B) {
					c, s := benchPair(b, 64<<10)
					target, _ := s.Alloc(size)
					defer target.Release()
					region, err := s.Expose(target, rdma.RemoteRead|rdma.RemoteWrite)
					if err != nil {
						b.Fatal(err)
					}
					buf, _ := c.Alloc(size)
					defer buf.Release()
					batch := c.NewBatch()
					ctx := context.Background()
					b.SetBytes(int64(size))
					b.ReportAllocs()
					b.ResetTimer()
					start := time.Now()
					for done := 0; done < b.N; {
						n := min(qd, b.N-done)
						for j := 0; j < n; j++ {
							if read {
								batch.Read(buf, region)
							} else {
								batch.Write(buf, region)
							}
						}
						if err := batch.Post().Wait(ctx); err != nil {
							b.Fatal(err)
						}
						done += n
					}
					report(b, size, time.Since(start))
				})
			}
			b.Run(fmt.Sprintf("raw/%s/qd%d", sizeName(size), qd), func(b *testing.B) {
				op := verbs.OpWrite
				if read {
					op = verbs.OpRead
				}
				rawBench(b, op, size, qd)
			})
		}
	}
}

// BenchmarkSendRecv: SEND to a peer that keeps receiving, through futures
// and the raw path.
func BenchmarkSendRecv(b *testing.B) {
	for _, size := range benchSizes {
		for _, qd := range []int{1, 64} {
			b.Run(fmt.Sprintf("future/%s/qd%d", sizeName(size), qd), func(b *testing.B) {
				benchSendRecv(b, size, qd)
			})
			b.Run(fmt.Sprintf("raw/%s/qd%d", sizeName(size), qd), func(b *testing.B) {
				rawBench(b, verbs.OpSend, size, qd)
			})
		}
	}
}

// benchSendRecv sends size bytes qd deep (waiting for the oldest future
// before posting anew) to a peer goroutine that receives with Recv and
// Wait, one at a time.
func benchSendRecv(b *testing.B, size, qd int) {
	c, s := benchPair(b, max(size, 64))
	buf, _ := c.Alloc(size)
	defer buf.Release()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < b.N; i++ {
			f := s.Recv()
			if err := f.Wait(ctx); err != nil {
				done <- err
				return
			}
			f.Buffer().Release()
			f.Release()
		}
		done <- nil
	}()
	window := make([]*rdma.Future, qd)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N+qd; i++ {
		slot := i % qd
		if f := window[slot]; f != nil {
			if err := f.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			f.Release()
			window[slot] = nil
		}
		if i < b.N {
			window[slot] = c.Send(buf)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	report(b, size, time.Since(start))
}

// rawBench drives a connected QP pair of the provider directly: post up
// to qd WRs, poll completions 64 at a time, re-post receives in batches.
func rawBench(b *testing.B, op verbs.Opcode, size, qd int) {
	var prov verbs.Provider = soft.Provider
	if benchProvider() == rdma.ProviderVerbs {
		prov = ibv.Provider
	}
	ctx, err := prov.Open("")
	if err != nil {
		b.Fatal(err) // RDMA_BENCH_PROVIDER asked for it; soft always opens
	}
	defer ctx.Close()
	pd, _ := ctx.AllocPD()
	defer pd.Close()
	cq, _ := ctx.CreateCQ(1024, nil)
	defer cq.Close()
	mk := func() verbs.QP {
		qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 128, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			b.Fatal(err)
		}
		return qp
	}
	a, z := mk(), mk()
	defer a.Close()
	defer z.Close()
	port := ctx.Info().Ports[0]
	gid, _ := verbs.SelectGID(port, true)
	for _, p := range [][2]verbs.QP{{a, z}, {z, a}} {
		p[0].ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite})
	}
	for _, p := range [][2]verbs.QP{{a, z}, {z, a}} {
		if err := p[0].ToRTR(verbs.RTRAttr{PathMTU: port.ActiveMTU, DestQPN: p[1].QPN(), RQPSN: 1,
			Dest: verbs.Address{Port: 1, LID: port.LID, GID: gid.GID, SGIDIndex: uint8(gid.Index)}, MinRNRTimer: 1}); err != nil {
			b.Fatal(err)
		}
		if err := p[0].ToRTS(verbs.RTSAttr{SQPSN: 1, Timeout: 14, RetryCount: 7, RNRRetry: 7}); err != nil {
			b.Fatal(err)
		}
	}
	memA, _ := mem.Map(size)
	memZ, _ := mem.Map(size * 256)
	defer mem.Unmap(memA)
	defer mem.Unmap(memZ)
	mrA, _ := pd.RegMR(memA, verbs.AccessLocalWrite)
	mrZ, _ := pd.RegMR(memZ, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	defer mrA.Close()
	defer mrZ.Close()
	recvs := make([]verbs.RecvWR, 256)
	rsge := make([]verbs.SGE, 256)
	for i := range recvs {
		rsge[i] = verbs.SGE{Addr: mrZ.Addr() + uint64(i*size), Length: uint32(size), LKey: mrZ.LKey()}
		recvs[i] = verbs.RecvWR{ID: 1 << 32, SGL: rsge[i : i+1]}
	}
	if op == verbs.OpSend {
		if _, err := z.PostRecv(recvs); err != nil {
			b.Fatal(err)
		}
	}
	sge := []verbs.SGE{{Addr: mrA.Addr(), Length: uint32(size), LKey: mrA.LKey()}}
	wr := []verbs.SendWR{{Opcode: op, Flags: verbs.SendSignaled, SGL: sge, RemoteAddr: mrZ.Addr(), RKey: mrZ.RKey()}}
	wc := make([]verbs.WorkCompletion, 64)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	posted, done, recvDone := 0, 0, 0
	deadline := time.Now().Add(time.Minute)
	for done < b.N {
		for posted < b.N && posted-done < qd {
			if _, err := a.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		n, err := cq.Poll(wc)
		if err != nil {
			b.Fatal(err)
		}
		reposts := 0
		for _, w := range wc[:n] {
			if w.Status != verbs.WCSuccess {
				b.Fatal(w.Err())
			}
			if w.WRID == 1<<32 {
				recvDone++
				reposts++
				continue
			}
			done++
		}
		if reposts > 0 {
			if _, err := z.PostRecv(recvs[:reposts]); err != nil {
				b.Fatal(err)
			}
		}
		if n == 0 && time.Now().After(deadline) {
			b.Fatal("raw benchmark stalled")
		}
	}
	report(b, size, time.Since(start))
}

// BenchmarkPingPong: 8 B SEND/Recv round trips at queue depth 1, the
// echo on another goroutine, per poll mode: what a request/response
// protocol pays. p50-us and p99-us are half round trips, as perftest's
// send_lat reports; busy is run to completion (Wait polls the CQ).
func BenchmarkPingPong(b *testing.B) {
	for _, m := range []struct {
		name string
		opts []rdma.Option
	}{
		{"adaptive", nil},
		{"busy", []rdma.Option{rdma.WithPollMode(rdma.PollBusy)}},
		{"event", []rdma.Option{rdma.WithPollMode(rdma.PollEvent)}},
		{"adaptive-locked", []rdma.Option{rdma.WithPollerThreadLock(true)}},
	} {
		b.Run(m.name, func(b *testing.B) {
			c, s := benchPair(b, 64, m.opts...)
			cb, _ := c.Alloc(8)
			defer cb.Release()
			sb, _ := s.Alloc(8)
			defer sb.Release()
			ctx := context.Background()
			done := make(chan error, 1)
			go func() {
				for i := 0; i < b.N; i++ {
					f := s.Recv()
					if err := f.Wait(ctx); err != nil {
						done <- err
						return
					}
					f.Buffer().Release()
					f.Release()
					sf := s.Send(sb)
					if err := sf.Wait(ctx); err != nil {
						done <- err
						return
					}
					sf.Release()
				}
				done <- nil
			}()
			lat := newLatencies(b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				lat.start()
				rf := c.Recv()
				sf := c.Send(cb)
				if err := sf.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				sf.Release()
				if err := rf.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				lat.stop()
				rf.Buffer().Release()
				rf.Release()
			}
			b.StopTimer()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			for i := range lat.d {
				lat.d[i] /= 2
			}
			lat.report(b)
		})
	}
}

// oversubscribed is the number of goroutines of BenchmarkOversubscribed:
// many more than the cores of the development machine (2).
const oversubscribed = 16

// BenchmarkOversubscribed: a key-value-style workload, 16 goroutines on
// one connection each doing request/response at queue depth 1, per poll
// mode. sendrecv: an 8 B SEND and the 8 B answer of one of 16 server
// goroutines; onesided: an 8 B READ of a value and a CAS of its lock
// word. ns/op is per request, so busy/adaptive is the ratio of the two
// ns/op. Here goroutines outnumber cores: Busy mode's spinning must not
// keep the goroutines that consume the completions off the CPU (see
// docs/history/performance.md, "Busy mode with more goroutines than cores").
func BenchmarkOversubscribed(b *testing.B) {
	for _, w := range []string{"sendrecv", "onesided"} {
		for _, m := range []rdma.PollMode{rdma.PollAdaptive, rdma.PollBusy, rdma.PollEvent} {
			b.Run(w+"/"+m.String(), func(b *testing.B) {
				c, s := benchPair(b, 64, rdma.WithPollMode(m))
				if w == "sendrecv" {
					benchOversubscribedSendRecv(b, c, s)
				} else {
					benchOversubscribedOneSided(b, c, s)
				}
				// Where the CPU went: empty polls (spinning) and parks.
				st := rdma.ConnPollerStats(c)
				b.ReportMetric(float64(st.EmptyPolls)/float64(b.N), "empty-polls/op")
				b.ReportMetric(float64(st.Parks)/float64(b.N), "parks/op")
			})
		}
	}
}

// runOversubscribed runs op b.N times on oversubscribed goroutines and
// fails the benchmark on the first error.
func runOversubscribed(b *testing.B, op func(ctx context.Context, g int) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var next atomic.Int64
	errc := make(chan error, oversubscribed)
	b.ReportAllocs()
	b.ResetTimer()
	for g := range oversubscribed {
		go func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(ctx, g); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range oversubscribed {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
}

func benchOversubscribedSendRecv(b *testing.B, c, s *rdma.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The server: as many goroutines, each taking a request and
	// answering it, until b.N are answered.
	var served atomic.Int64
	done := make(chan error, oversubscribed)
	for range oversubscribed {
		go func() {
			sb, err := s.Alloc(8)
			if err != nil {
				done <- err
				return
			}
			defer sb.Release()
			for served.Add(1) <= int64(b.N) {
				f := s.Recv()
				if err := f.Wait(ctx); err != nil {
					done <- err
					return
				}
				f.Buffer().Release()
				if err := s.Send(sb).Wait(ctx); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	bufs := make([]*rdma.Buffer, oversubscribed)
	for g := range bufs {
		bufs[g], _ = c.Alloc(8)
		defer bufs[g].Release()
	}
	runOversubscribed(b, func(ctx context.Context, g int) error {
		rf := c.Recv()
		if err := c.Send(bufs[g]).Wait(ctx); err != nil {
			return err
		}
		if err := rf.Wait(ctx); err != nil {
			return err
		}
		rf.Buffer().Release()
		return nil
	})
	for range oversubscribed {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}

func benchOversubscribedOneSided(b *testing.B, c, s *rdma.Conn) {
	// One 16 B record per goroutine: an 8 B value and its lock word.
	table, _ := s.Alloc(16 * oversubscribed)
	defer table.Release()
	region, err := s.Expose(table, rdma.RemoteRead|rdma.RemoteAtomic)
	if err != nil {
		b.Fatal(err)
	}
	bufs := make([]*rdma.Buffer, oversubscribed)
	for g := range bufs {
		bufs[g], _ = c.Alloc(8)
		defer bufs[g].Release()
	}
	runOversubscribed(b, func(ctx context.Context, g int) error {
		value, _ := region.Slice(16*g, 8)
		lock, _ := region.Slice(16*g+8, 8)
		if err := c.Read(bufs[g], value).Wait(ctx); err != nil {
			return err
		}
		f := c.CompareAndSwap(lock, 0, 0)
		if err := f.Wait(ctx); err != nil {
			return err
		}
		return nil
	})
}
