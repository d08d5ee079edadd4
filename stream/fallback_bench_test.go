package stream_test

// BenchmarkFallbackCrossProcess: the stream that fell back to TCP
// against TCP loopback and against the stream over the soft provider,
// between two processes, in one run:
//
//	go test -run '^$' -bench FallbackCrossProcess -count 6 ./stream

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/stream"
)

// fallbackKinds are the transports the benchmark compares, in the order
// of the child's listeners of each service.
var fallbackKinds = []string{"tcp", "rdma-fallback", "rdma-soft"}

// fallbackOptions are the stream options of each kind but TCP: the
// defaults with the auto provider (here, without a device, it falls
// back), and the soft provider with the fallback off.
func fallbackOptions(kind string) []rdma.Option {
	if kind == "rdma-fallback" {
		return []rdma.Option{rdma.WithProvider(rdma.ProviderAuto)}
	}
	return []rdma.Option{rdma.WithProvider(rdma.ProviderSoft), rdma.WithTCPFallback(false)}
}

// fallbackSinkChild is the child of BenchmarkFallbackCrossProcess: for
// each kind it listens for an echo, a gRPC echo server and an HTTP
// server, prints the nine addresses and serves until its stdin closes.
func fallbackSinkChild() int {
	listen := func(kind string) (net.Listener, error) {
		if kind == "tcp" {
			return net.Listen("tcp", "127.0.0.1:0")
		}
		return stream.Listen("rdma", "127.0.0.1:0", fallbackOptions(kind)...)
	}
	var addrs []string
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&echoDesc, echoServer{})
	body := strings.Repeat("x", 1<<10)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	})}
	for _, kind := range fallbackKinds {
		var ls [3]net.Listener
		for i := range ls {
			l, err := listen(kind)
			if err != nil {
				fmt.Println("listen:", err)
				return 1
			}
			ls[i] = l
			addrs = append(addrs, l.Addr().String())
		}
		go func() {
			for {
				c, err := ls[0].Accept()
				if err != nil {
					return
				}
				go serveChild(c)
			}
		}()
		go srv.Serve(ls[1])
		go hs.Serve(ls[2])
	}
	fmt.Println(strings.Join(addrs, " "))
	io.Copy(io.Discard, os.Stdin)
	srv.Stop()
	hs.Close()
	return 0
}

// bestRoundsOf runs rounds of each of fs in turn, each round starting
// with the next, and returns the best round of each; only the rounds of fs[1] (the fallback) count for
// ns/op and allocs/op.
func bestRoundsOf(b *testing.B, fs ...func() error) []time.Duration {
	b.Helper()
	best := make([]time.Duration, len(fs))
	b.ResetTimer()
	b.StopTimer()
	for r := range rounds {
		// Each round starts with another kind: none always follows the
		// same one.
		for j := range fs {
			i := (j + r) % len(fs)
			f := fs[i]
			if i == 1 {
				b.StartTimer()
			}
			start := time.Now()
			err := f()
			t := time.Since(start)
			if i == 1 {
				b.StopTimer()
			}
			if err != nil {
				b.Fatal(err)
			}
			if best[i] == 0 || t < best[i] {
				best[i] = t
			}
		}
	}
	return best
}

// reportKinds reports each kind's best round as µs per operation, and
// the speed of the fallback and of the soft stream relative to TCP.
func reportKinds(b *testing.B, ops int, best []time.Duration) {
	for i, kind := range fallbackKinds {
		b.ReportMetric(best[i].Seconds()*1e6/float64(ops), kind+"-µs/op")
	}
	b.ReportMetric(best[0].Seconds()/best[1].Seconds(), "fallback/tcp")
	b.ReportMetric(best[0].Seconds()/best[2].Seconds(), "soft/tcp")
}

// BenchmarkFallbackCrossProcess compares, between two processes, TCP
// loopback (tcp), the stream that fell back to TCP (rdma-fallback) and
// the stream over the soft provider (rdma-soft): a 64 B ping-pong with
// an echo, unary gRPC calls of 1 KiB one at a time, and sequential
// net/http GETs of 1 KiB on one kept-alive connection. Rounds of the
// three alternate (bestRoundsOf); the ratios are speeds against TCP
// (above 1: faster). Each connection is made and warmed before.
func BenchmarkFallbackCrossProcess(b *testing.B) {
	child := testchild.Start(context.Background(), b, "fallback-sink")
	line := child.ReadLine(b)
	f := strings.Fields(line)
	require.Len(b, f, 3*len(fallbackKinds), "fallback child said %q", line)
	addr := func(kind, service int) string { return f[3*kind+service] }
	dialer := func(kind string) func(ctx context.Context, network, a string) (net.Conn, error) {
		if kind == "tcp" {
			var d net.Dialer
			return d.DialContext
		}
		d := &stream.Dialer{Options: fallbackOptions(kind)}
		return d.DialContext
	}

	b.Run("pingpong/64B", func(b *testing.B) {
		var rs []func() error
		m := max(b.N/rounds, 16)
		for i, kind := range fallbackKinds {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			c, err := dialer(kind)(ctx, "tcp", addr(i, 0))
			cancel()
			require.NoError(b, err)
			b.Cleanup(func() { c.Close() })
			if s, ok := c.(*stream.Conn); ok {
				require.Equal(b, kind == "rdma-fallback", s.Transport() == rdma.TCP, kind)
			}
			_, err = c.Write([]byte{'e'})
			require.NoError(b, err)
			require.NoError(b, pingPongRound(c, 16, 64))
			rs = append(rs, func() error { return pingPongRound(c, m, 64) })
		}
		b.SetBytes(64)
		b.ReportAllocs()
		reportKinds(b, m, bestRoundsOf(b, rs...))
	})

	b.Run("grpc/unary/1KiB", func(b *testing.B) {
		var rs []func() error
		m := max(b.N/rounds, 64)
		for i, kind := range fallbackKinds {
			dial := dialer(kind)
			cc, err := grpc.NewClient("passthrough:///"+addr(i, 1),
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
				grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return dial(ctx, "tcp", a) }))
			require.NoError(b, err)
			b.Cleanup(func() { cc.Close() })
			round := func() error {
				_, err := unaryRound(cc, m, 1, 1<<10)
				return err
			}
			require.NoError(b, round()) // warm: the connection, gRPC's windows
			rs = append(rs, round)
		}
		reportKinds(b, m, bestRoundsOf(b, rs...))
	})

	b.Run("http/seq/1KiB", func(b *testing.B) {
		var rs []func() error
		m := max(b.N/rounds, 64)
		for i, kind := range fallbackKinds {
			tr := &http.Transport{DialContext: dialer(kind), MaxIdleConnsPerHost: 1}
			b.Cleanup(tr.CloseIdleConnections)
			cl := &http.Client{Transport: tr}
			url := "http://" + addr(i, 2) + "/"
			round := func() error {
				for range m {
					resp, err := cl.Get(url)
					if err != nil {
						return err
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil {
						return err
					}
				}
				return nil
			}
			require.NoError(b, round())
			rs = append(rs, round)
		}
		b.ReportAllocs()
		reportKinds(b, m, bestRoundsOf(b, rs...))
	})
}
