package stream_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/benchmark"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/go-rdma/rdma/stream"
)

// BenchmarkGRPCService runs gRPC's own benchmark service
// (google.golang.org/grpc/benchmark: BenchmarkService with protobuf
// messages, as grpc-go's benchmain runs it) in a child process and calls
// it over the stream and over TCP loopback, alternating rounds: unary
// calls, and round trips on streaming calls (one stream per caller), of
// 1 KiB each way, from 1 and 16 callers at once; and 64 KiB each way on
// 4 streaming calls, for throughput. It reports each transport's best
// round as calls a second and their ratio, each transport's median and
// 99th percentile call time over all its rounds, and for 64 KiB the
// bytes a second each way.
func BenchmarkGRPCService(b *testing.B) {
	addrs := startSink(b)
	d := &stream.Dialer{Options: benchOptions()}
	client := func(addr string, viaStream bool) testgrpc.BenchmarkServiceClient {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if viaStream {
			opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
				return d.DialContext(ctx, "rdma", a)
			}))
		}
		cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
		require.NoError(b, err)
		b.Cleanup(func() { cc.Close() })
		return testgrpc.NewBenchmarkServiceClient(cc)
	}
	tcp, strm := client(addrs.serviceTCP, false), client(addrs.serviceStream, true)
	for _, c := range []struct {
		kind      string
		size, par int
	}{
		{"unary", 1 << 10, 1},
		{"unary", 1 << 10, 16},
		{"streaming", 1 << 10, 1},
		{"streaming", 1 << 10, 16},
		{"streaming", 64 << 10, 4},
	} {
		b.Run(fmt.Sprintf("%s/%s/%dKiB/par%d", benchProvider(), c.kind, c.size>>10, c.par), func(b *testing.B) {
			m := max(b.N/rounds, 64)
			var lat [2][]time.Duration // TCP's, the stream's
			round := func(tc testgrpc.BenchmarkServiceClient, keep *[]time.Duration) func() error {
				return func() error {
					times, err := serviceRound(tc, c.kind, m, c.par, c.size)
					if keep != nil {
						*keep = append(*keep, times...)
					}
					return err
				}
			}
			// Warm both: connections, gRPC's windows.
			require.NoError(b, round(tcp, nil)())
			require.NoError(b, round(strm, nil)())
			bestTCP, bestStream := bestRounds(b, round(tcp, &lat[0]), round(strm, &lat[1]))
			b.ReportMetric(float64(m)/bestStream.Seconds(), "stream-calls/s")
			b.ReportMetric(float64(m)/bestTCP.Seconds(), "tcp-calls/s")
			b.ReportMetric(bestTCP.Seconds()/bestStream.Seconds(), "stream/tcp")
			for i, name := range []string{"tcp", "stream"} {
				slices.Sort(lat[i])
				b.ReportMetric(float64(lat[i][len(lat[i])/2].Microseconds()), name+"-p50-µs")
				b.ReportMetric(float64(lat[i][len(lat[i])*99/100].Microseconds()), name+"-p99-µs")
			}
			if c.size >= 64<<10 {
				b.ReportMetric(float64(m*c.size)/bestStream.Seconds()/1e6, "stream-MB/s")
				b.ReportMetric(float64(m*c.size)/bestTCP.Seconds()/1e6, "tcp-MB/s")
			}
		})
	}
}

// serviceRound makes n calls of kind ("unary" or "streaming": round
// trips on one streaming call per caller) with size bytes each way to
// the benchmark service of tc, from par callers, and returns each
// call's time.
func serviceRound(tc testgrpc.BenchmarkServiceClient, kind string, n, par, size int) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	times := make([]time.Duration, n)
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range par {
		g.Go(func() error {
			var call func() error
			switch kind {
			case "unary":
				call = func() error { return benchmark.DoUnaryCall(tc, size, size) }
			case "streaming":
				st, err := tc.StreamingCall(ctx)
				if err != nil {
					return err
				}
				defer st.CloseSend()
				call = func() error { return benchmark.DoStreamingRoundTrip(st, size, size) }
			}
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return nil
				}
				start := time.Now()
				if err := call(); err != nil {
					return err
				}
				times[i] = time.Since(start)
			}
		})
	}
	return times, g.Wait()
}
