package stream_test

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/leak"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/go-rdma/rdma/stream"
)

// The tests use the internal leak check and child-process helpers; the
// package itself imports nothing but rdma's public API (.golangci.yml).

func TestMain(m *testing.M) {
	// The roles the tests start this binary in, as a second process.
	testchild.Main(map[string]func() int{
		"stream-writer": streamWriterChild,
		"stream-sink":   streamSinkChild,
		"fallback-sink": fallbackSinkChild,
	})
	// A Buffer a test never releases fails the run (exit 99) and is
	// reported with the place that allocated it.
	goleak.VerifyTestMain(leak.Checked(m))
}

// eachProvider runs f as a subtest per set-up: "soft" always, and
// "soft-header", the soft provider in header mode (ring.go), which
// rdma_cm set-ups use; "verbs" where a usable device exists, and
// "verbs-rdma_cm", the verbs provider through rdma_cm, in the VM harness
// (which sets RDMA_VM_IP0: on rxe's address, then on siw's). Without a
// device the verbs subtests skip, unless RDMA_TEST_REQUIRE_DEVICE=1 makes
// that a failure. The subtest names carry the provider, so the VM harness
// can count what ran on rxe. f listens on listenAddr(t).
func eachProvider(t *testing.T, f func(t *testing.T, opts []rdma.Option)) {
	t.Helper()
	eachSetup(t, true, f)
}

// eachTCPSetup is eachProvider without rdma_cm, for tests of what needs
// go-rdma's own set-up (its TCP control channel: TLS, the handshake).
func eachTCPSetup(t *testing.T, f func(t *testing.T, opts []rdma.Option)) {
	t.Helper()
	eachSetup(t, false, f)
}

func eachSetup(t *testing.T, cm bool, f func(t *testing.T, opts []rdma.Option)) {
	t.Helper()
	soft, verbs := rdma.WithProvider(rdma.ProviderSoft), rdma.WithProvider(rdma.ProviderVerbs)
	t.Run("soft", func(t *testing.T) { f(t, []rdma.Option{soft}) })
	t.Run("soft-header", func(t *testing.T) {
		stream.ForceHeaderMode(t)
		f(t, []rdma.Option{soft})
	})
	t.Run("verbs", func(t *testing.T) {
		requireDevice(t)
		f(t, []rdma.Option{verbs})
	})
	if cm {
		t.Run("verbs-rdma_cm", func(t *testing.T) {
			requireCM(t)
			f(t, []rdma.Option{verbs, rdma.WithRDMACM()})
		})
	}
}

// requireCM skips (or fails, under RDMA_TEST_REQUIRE_DEVICE=1) outside
// the VM harness, which sets RDMA_VM_IP0 to an address of an RDMA device.
func requireCM(t *testing.T) {
	t.Helper()
	if os.Getenv("RDMA_VM_IP0") != "" {
		return
	}
	if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
		t.Fatal("RDMA_VM_IP0 unset and RDMA_TEST_REQUIRE_DEVICE=1")
	}
	t.Skip("rdma_cm tests run in the VM harness, which sets RDMA_VM_IP0")
}

// listenAddr is where t's subtest listens: a port of RDMA_VM_IP0 for
// rdma_cm (which finds the device by the address), else of loopback.
func listenAddr(t testing.TB) string {
	if strings.Contains(t.Name(), "/verbs-rdma_cm") {
		return os.Getenv("RDMA_VM_IP0") + ":0"
	}
	return "127.0.0.1:0"
}

// streamPair is rdmatest.StreamPair on listenAddr(t).
func streamPair(t testing.TB, opts ...rdma.Option) (client, server *stream.Conn) {
	t.Helper()
	if listenAddr(t) == "127.0.0.1:0" {
		return rdmatest.StreamPair(t, opts...)
	}
	l, err := stream.Listen("rdma", listenAddr(t), opts...)
	require.NoError(t, err)
	defer l.Close()
	return dialListener(t, l, opts...)
}

// dialListener dials l and accepts the connection, within a minute; t's
// cleanup closes both ends.
func dialListener(t testing.TB, l net.Listener, opts ...rdma.Option) (client, server *stream.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.(*stream.Listener).AcceptContext(ctx)
		acc <- c
	}()
	c, err := stream.Dial(ctx, "rdma", l.Addr().String(), opts...)
	s := <-acc
	if err != nil || s == nil {
		if s != nil {
			s.Close()
		}
		t.Fatalf("stream pair: dial %v, accept %v", err, s != nil)
	}
	client, server = c.(*stream.Conn), s.(*stream.Conn)
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

// requireDevice skips (or fails, under RDMA_TEST_REQUIRE_DEVICE=1) when
// no verbs device is usable.
// echo answers rounds messages of size bytes read from s with
// themselves, in a goroutine, and sends how it ended on the channel it
// returns.
func echo(s io.ReadWriter, size, rounds int) <-chan error {
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range rounds {
			if _, err := io.ReadFull(s, buf); err != nil {
				done <- err
				return
			}
			if _, err := s.Write(buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

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
	el := time.Since(start)
	b.ReportMetric(float64(b.N)*float64(size)*8/el.Seconds()/1e9, "Gb/s")
	b.ReportMetric(float64(b.N)/el.Seconds()/1e6, "Mops/s")
}
