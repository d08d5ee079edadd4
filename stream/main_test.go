package stream_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/leak"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/rdmatest"
)

// The tests use the internal leak check and child-process helpers; the
// package itself imports nothing but rdma's public API (.golangci.yml).

func TestMain(m *testing.M) {
	// The roles the tests start this binary in, as a second process.
	testchild.Main(map[string]func() int{
		"stream-writer": streamWriterChild,
		"stream-sink":   streamSinkChild,
	})
	// A Buffer a test never releases fails the run (exit 99) and is
	// reported with the place that allocated it.
	goleak.VerifyTestMain(leak.Checked(m))
}

// eachProvider runs f as a subtest per provider: "soft" always, "verbs"
// where a usable device exists. Without one the verbs subtest skips,
// unless RDMA_TEST_REQUIRE_DEVICE=1 makes that a failure. The subtest
// names carry the provider, so the VM harness can count what ran on rxe.
func eachProvider(t *testing.T, f func(t *testing.T, opts []rdma.Option)) {
	t.Helper()
	for _, p := range []string{rdma.ProviderSoft, rdma.ProviderVerbs} {
		t.Run(p, func(t *testing.T) {
			if p == rdma.ProviderVerbs {
				requireDevice(t)
			}
			f(t, []rdma.Option{rdma.WithProvider(p)})
		})
	}
}

// requireDevice skips (or fails, under RDMA_TEST_REQUIRE_DEVICE=1) when
// no verbs device is usable.
func requireDevice(t *testing.T) {
	t.Helper()
	devs, err := rdma.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Provider == rdma.ProviderVerbs && d.Usable {
			return
		}
	}
	if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
		t.Fatal("no usable verbs device and RDMA_TEST_REQUIRE_DEVICE=1")
	}
	t.Skip("no usable verbs device; ./test.sh runs these tests on rxe in a VM")
}

// benchProvider is the provider the benchmarks run on:
// $RDMA_BENCH_PROVIDER, soft by default.
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

// benchSendRecv sends size bytes qd deep with the async API (waiting for
// the oldest future before posting anew) to a peer goroutine that
// receives with Recv and Wait, one at a time: the root package's
// BenchmarkSendRecv, for the stream/raw ratio.
func benchSendRecv(b *testing.B, size, qd int) {
	opts := append(benchOptions(), rdma.WithMaxMessage(max(size, 64)), rdma.WithQueueDepth(128, 128))
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(b, err)
	defer ln.Close()
	c, s := rdmatest.Connect(b, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", address, opts...)
	})
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
			window[slot] = nil
		}
		if i < b.N {
			window[slot] = c.Send(buf)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	b.ReportMetric(float64(b.N)*float64(size)*8/el.Seconds()/1e9, "Gb/s")
	b.ReportMetric(float64(b.N)/el.Seconds()/1e6, "Mops/s")
}
