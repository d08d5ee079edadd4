package stream_test

// Benchmarks of the stream against Go's TCP loopback in the same run.
//
//	go test -run '^$' -bench Stream -benchtime 2s -count 3 .
//
// RDMA_BENCH_PROVIDER=soft|verbs chooses the provider (default soft),
// RDMA_BENCH_POLL=adaptive|busy|event the poll mode (default: the
// library's);
// RDMA_SOFT_TRANSPORT=tcp makes the soft provider carry even in-process
// traffic over loopback TCP. Throughput is reported in Gb/s (10^9
// bits/s), latency as the round trip of a 64-byte ping-pong in µs.
// docs/stream.md has the figures, docs/history/stream.md how they moved.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/benchmark"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/go-rdma/rdma/stream"
)

type connPairFunc func(b *testing.B) (c, s net.Conn)

func benchTransports() []struct {
	name string
	pair connPairFunc
} {
	return []struct {
		name string
		pair connPairFunc
	}{
		{"tcp", tcpPair},
		{"rdma-" + benchProvider(), func(b *testing.B) (net.Conn, net.Conn) {
			c, s := rdmatest.StreamPair(b, benchOptions()...)
			return c, s
		}},
	}
}

// tcpPair is a loopback TCP connection.
func tcpPair(b *testing.B) (c, s net.Conn) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		s, _ := ln.Accept()
		ch <- s
	}()
	c, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s = <-ch
	if s == nil {
		b.Fatal("accept failed")
	}
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// BenchmarkStreamThroughput: 64 KiB writes on 1 and 4 connections at
// once, each read by a goroutine with a 64 KiB buffer, on the stream and
// on TCP loopback. The two alternate in 8 rounds and each reports its best
// round (stream-Gb/s, tcp-Gb/s, and their ratio stream/tcp): on a shared
// machine other load only ever slows a round down, and it comes in phases
// of seconds that would otherwise fall on one side. ns/op and MB/s count
// the stream's rounds only and are not the figures.
func BenchmarkStreamThroughput(b *testing.B) {
	const size = 64 << 10
	for _, conns := range []int{1, 4} {
		b.Run(fmt.Sprintf("%s/conns%d/64KiB", benchProvider(), conns), func(b *testing.B) {
			var tcp, strm [2][]net.Conn
			for i := 0; i < conns; i++ {
				c, s := tcpPair(b)
				tcp[0], tcp[1] = append(tcp[0], c), append(tcp[1], s)
				sc, ss := rdmatest.StreamPair(b, benchOptions()...)
				strm[0], strm[1] = append(strm[0], sc), append(strm[1], ss)
			}
			m := max(b.N/rounds, 16)
			bestOf(b, size, m, func() error { return streamRound(tcp[0], tcp[1], m, size) },
				func() error { return streamRound(strm[0], strm[1], m, size) })
		})
	}
	// The async API's own SEND throughput on the same device, for the
	// stream/raw ratio.
	b.Run("async-send-"+benchProvider()+"/conns1/64KiB", func(b *testing.B) {
		benchSendRecv(b, size, 64)
	})
}

// rounds is how many rounds of each side bestRounds runs.
const rounds = 8

// bestRounds runs rounds of tcp and of stream alternately and returns
// the best round of each: on a shared machine other load comes in phases
// of seconds and only ever slows a round down. Only the stream's rounds
// count for ns/op and allocs/op.
func bestRounds(b *testing.B, tcp, strm func() error) (bestTCP, bestStream time.Duration) {
	b.Helper()
	best := func(d *time.Duration, round func() error) {
		start := time.Now()
		if err := round(); err != nil {
			b.Fatal(err)
		}
		if t := time.Since(start); *d == 0 || t < *d {
			*d = t
		}
	}
	b.ResetTimer()
	for range rounds {
		b.StopTimer()
		best(&bestTCP, tcp)
		b.StartTimer()
		best(&bestStream, strm)
	}
	b.StopTimer()
	return bestTCP, bestStream
}

// bestOf runs bestRounds of tcp and of stream, each moving ops messages
// of size bytes, and reports the best round of each (stream-Gb/s,
// tcp-Gb/s) and their ratio (stream/tcp).
func bestOf(b *testing.B, size, ops int, tcp, strm func() error) {
	b.Helper()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	bestTCP, bestStream := bestRounds(b, tcp, strm)
	gbps := func(d time.Duration) float64 { return float64(ops*size) * 8 / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(bestStream), "stream-Gb/s")
	b.ReportMetric(gbps(bestTCP), "tcp-Gb/s")
	b.ReportMetric(bestTCP.Seconds()/bestStream.Seconds(), "stream/tcp")
}

// streamRound writes n messages of size bytes spread over the
// connections cs, each read on ss by a goroutine of its own, and returns
// when all are read.
func streamRound(cs, ss []net.Conn, n, size int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(cs))
	for i := range cs {
		k := n / len(cs)
		if i < n%len(cs) {
			k++
		}
		wg.Add(2)
		go func(c net.Conn) {
			defer wg.Done()
			buf := make([]byte, size)
			for j := 0; j < k; j++ {
				if _, err := c.Write(buf); err != nil {
					errs <- err
					return
				}
			}
		}(cs[i])
		go func(s net.Conn) {
			defer wg.Done()
			buf := make([]byte, size)
			for left := k * size; left > 0; {
				r, err := s.Read(buf[:min(left, size)])
				if err != nil {
					errs <- err
					return
				}
				left -= r
			}
		}(ss[i])
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// BenchmarkStreamPingPong: 64 bytes there and back; µs per round trip.
func BenchmarkStreamPingPong(b *testing.B) {
	const size = 64
	for _, tr := range benchTransports() {
		b.Run(tr.name+"/64B", func(b *testing.B) {
			c, s := tr.pair(b)
			done := echo(s, size, b.N)
			buf := make([]byte, size)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
			el := time.Since(start)
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(el.Seconds()*1e6/float64(b.N), "µs/rtt")
		})
	}
}

// streamSinkChild is the child of BenchmarkStreamCrossProcess and
// BenchmarkGRPCCrossProcess: it listens for TCP and for the stream on
// loopback, three times each, prints the six addresses, and serves
// every connection until its stdin closes. On the first two, with sink
// when its first byte is 's', with echo when it is 'e'; on the next two
// with a gRPC server of echoDesc; on the last two with gRPC's own
// benchmark service (BenchmarkGRPCService).
func streamSinkChild() int {
	var ls []net.Listener
	for range 3 {
		tl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("listen:", err)
			return 1
		}
		sl, err := stream.Listen("rdma", "127.0.0.1:0", benchOptions()...)
		if err != nil {
			fmt.Println("listen:", err)
			return 1
		}
		ls = append(ls, tl, sl)
	}
	for _, l := range ls[:2] {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go serveChild(c)
			}
		}()
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&echoDesc, echoServer{})
	for _, l := range ls[2:4] {
		go srv.Serve(l)
	}
	for _, l := range ls[4:] {
		defer benchmark.StartServer(benchmark.ServerInfo{Type: "protobuf", Listener: l})()
	}
	fmt.Println(ls[0].Addr(), ls[1].Addr(), ls[2].Addr(), ls[3].Addr(), ls[4].Addr(), ls[5].Addr())
	io.Copy(io.Discard, os.Stdin)
	srv.Stop()
	return 0
}

func serveChild(c net.Conn) {
	defer c.Close()
	var mode [1]byte
	if _, err := io.ReadFull(c, mode[:]); err != nil {
		return
	}
	switch mode[0] {
	case 's':
		sink(c)
	case 'e':
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	}
}

// sink reads rounds: an 8-byte count, that many bytes, then it answers
// one byte.
func sink(c net.Conn) {
	var hdr [8]byte
	buf := make([]byte, 64<<10)
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		for left := binary.BigEndian.Uint64(hdr[:]); left > 0; {
			n, err := c.Read(buf[:min(left, uint64(len(buf)))])
			if err != nil {
				return
			}
			left -= uint64(n)
		}
		if _, err := c.Write(hdr[:1]); err != nil {
			return
		}
	}
}

// sinkAddrs are the addresses the sink child serves on.
type sinkAddrs struct{ tcp, stream, grpcTCP, grpcStream, serviceTCP, serviceStream string }

// startSink starts the sink child and returns its addresses; it is
// killed when b ends.
func startSink(b *testing.B) sinkAddrs {
	b.Helper()
	child := testchild.Start(context.Background(), b, "stream-sink")
	line := child.ReadLine(b)
	f := strings.Fields(line)
	require.Len(b, f, 6, "sink child said %q", line)
	return sinkAddrs{f[0], f[1], f[2], f[3], f[4], f[5]}
}

// sinkRound sends n messages of size bytes spread over cs to the sink
// child and returns when it has acknowledged all of them.
func sinkRound(cs []net.Conn, n, size int) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(cs))
	for i, c := range cs {
		k := n / len(cs)
		if i < n%len(cs) {
			k++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, size)
			binary.BigEndian.PutUint64(buf, uint64(k*size))
			if _, err := c.Write(buf[:8]); err != nil {
				errs <- err
				return
			}
			for j := 0; j < k; j++ {
				if _, err := c.Write(buf); err != nil {
					errs <- err
					return
				}
			}
			if _, err := io.ReadFull(c, buf[:1]); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// BenchmarkStreamCrossProcess is BenchmarkStreamThroughput between two
// processes: 64 KiB writes on 1 and 4 connections, and 256 B writes on
// one, from this process to a sink child, over the stream and over TCP
// loopback, alternating rounds (bestOf); and a 64 B ping-pong with an
// echo in the child, alternating rounds the same way. A round ends when
// the child has read everything and answered. On soft, the stream
// crosses the processes over the soft provider's TCP transport.
func BenchmarkStreamCrossProcess(b *testing.B) {
	addrs := startSink(b)
	tcpAddr, streamAddr := addrs.tcp, addrs.stream
	dial := func(b *testing.B, mode byte) (tcp, strm net.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := net.Dial("tcp", tcpAddr)
		require.NoError(b, err)
		b.Cleanup(func() { c.Close() })
		sc, err := stream.Dial(ctx, "rdma", streamAddr, benchOptions()...)
		require.NoError(b, err)
		b.Cleanup(func() { sc.Close() })
		for _, x := range []net.Conn{c, sc} {
			_, err := x.Write([]byte{mode})
			require.NoError(b, err)
		}
		return c, sc
	}
	for _, bc := range []struct{ conns, size int }{{1, 64 << 10}, {4, 64 << 10}, {1, 256}} {
		b.Run(fmt.Sprintf("%s/conns%d/%s", benchProvider(), bc.conns, sizeName(bc.size)), func(b *testing.B) {
			var tcp, strm []net.Conn
			for range bc.conns {
				c, sc := dial(b, 's')
				tcp, strm = append(tcp, c), append(strm, sc)
			}
			m := max(b.N/rounds, 16)
			bestOf(b, bc.size, m, func() error { return sinkRound(tcp, m, bc.size) },
				func() error { return sinkRound(strm, m, bc.size) })
		})
	}
	b.Run(benchProvider()+"/pingpong/64B", func(b *testing.B) {
		c, sc := dial(b, 'e')
		m := max(b.N/rounds, 16)
		bestOf(b, 64, m, func() error { return pingPongRound(c, m, 64) },
			func() error { return pingPongRound(sc, m, 64) })
	})
}

func sizeName(n int) string {
	if n >= 1<<10 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// pingPongRound writes n messages of size bytes to an echo, each after
// the echo of the one before.
func pingPongRound(c net.Conn, n, size int) error {
	buf := make([]byte, size)
	for range n {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkGRPCCrossProcess makes unary gRPC calls of 1 KiB (an echo)
// from this process to a server in a child process, over the stream and
// over TCP loopback, one at a time and from 16 goroutines at once,
// alternating rounds; it reports each transport's best round as calls a
// second, their ratio, and the stream's median and 99th percentile call
// time over all its rounds.
func BenchmarkGRPCCrossProcess(b *testing.B) {
	addrs := startSink(b)
	d := &stream.Dialer{Options: benchOptions()}
	client := func(addr string, viaStream bool) *grpc.ClientConn {
		opts := []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
		}
		if viaStream {
			opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
				return d.DialContext(ctx, "rdma", a)
			}))
		}
		cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
		require.NoError(b, err)
		b.Cleanup(func() { cc.Close() })
		return cc
	}
	tcp, strm := client(addrs.grpcTCP, false), client(addrs.grpcStream, true)
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("%s/unary/1KiB/par%d", benchProvider(), par), func(b *testing.B) {
			m := max(b.N/rounds, 64)
			var lat []time.Duration
			round := func(cc *grpc.ClientConn, keep bool) func() error {
				return func() error {
					times, err := unaryRound(cc, m, par, 1<<10)
					if keep {
						lat = append(lat, times...)
					}
					return err
				}
			}
			// Warm both: connections, gRPC's windows.
			require.NoError(b, round(tcp, false)())
			require.NoError(b, round(strm, false)())
			bestTCP, bestStream := bestRounds(b, round(tcp, false), round(strm, true))
			slices.Sort(lat)
			b.ReportMetric(float64(m)/bestStream.Seconds(), "stream-calls/s")
			b.ReportMetric(float64(m)/bestTCP.Seconds(), "tcp-calls/s")
			b.ReportMetric(bestTCP.Seconds()/bestStream.Seconds(), "stream/tcp")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "stream-p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "stream-p99-µs")
		})
	}
}

// unaryRound makes n unary Echo calls of size bytes on cc from par
// goroutines and returns each call's time.
func unaryRound(cc *grpc.ClientConn, n, par, size int) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	times := make([]time.Duration, n)
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range par {
		g.Go(func() error {
			in, out := make([]byte, size), make([]byte, 0, size)
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return nil
				}
				start := time.Now()
				if err := cc.Invoke(ctx, "/gordma.test.Echo/Echo", &in, &out); err != nil {
					return err
				}
				times[i] = time.Since(start)
			}
		})
	}
	return times, g.Wait()
}
