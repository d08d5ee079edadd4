package rdma_test

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
// docs/stream.md records the figures.

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
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
			c, s := streamPair(b, benchOptions()...)
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
	const size, rounds = 64 << 10, 8
	for _, conns := range []int{1, 4} {
		b.Run(fmt.Sprintf("%s/conns%d/64KiB", benchProvider(), conns), func(b *testing.B) {
			var tcp, stream [2][]net.Conn
			for i := 0; i < conns; i++ {
				c, s := tcpPair(b)
				tcp[0], tcp[1] = append(tcp[0], c), append(tcp[1], s)
				sc, ss := streamPair(b, benchOptions()...)
				stream[0], stream[1] = append(stream[0], sc), append(stream[1], ss)
			}
			m := max(b.N/rounds, 16)
			var bestTCP, bestStream time.Duration
			best := func(d *time.Duration, pair [2][]net.Conn) {
				start := time.Now()
				if err := streamRound(pair[0], pair[1], m, size); err != nil {
					b.Fatal(err)
				}
				if t := time.Since(start); *d == 0 || t < *d {
					*d = t
				}
			}
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			for range rounds {
				b.StopTimer()
				best(&bestTCP, tcp)
				b.StartTimer()
				best(&bestStream, stream)
			}
			b.StopTimer()
			gbps := func(d time.Duration) float64 { return float64(m) * size * 8 / d.Seconds() / 1e9 }
			b.ReportMetric(gbps(bestStream), "stream-Gb/s")
			b.ReportMetric(gbps(bestTCP), "tcp-Gb/s")
			b.ReportMetric(bestTCP.Seconds()/bestStream.Seconds(), "stream/tcp")
		})
	}
	// The async API's own SEND throughput on the same device, for the
	// stream/raw ratio.
	b.Run("async-send-"+benchProvider()+"/conns1/64KiB", func(b *testing.B) {
		c, s := benchPair(b, size)
		buf, _ := c.Alloc(size)
		defer buf.Release()
		ctx := context.Background()
		done := make(chan error, 1)
		b.SetBytes(size)
		b.ResetTimer()
		start := time.Now()
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
		const qd = 64
		window := make([]*rdma.Future, qd)
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
		b.ReportMetric(float64(b.N)*size*8/el.Seconds()/1e9, "Gb/s")
	})
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
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, size)
				for i := 0; i < b.N; i++ {
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
