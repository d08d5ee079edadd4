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
// once, each read by a goroutine with a 64 KiB buffer.
func BenchmarkStreamThroughput(b *testing.B) {
	const size = 64 << 10
	for _, conns := range []int{1, 4} {
		for _, tr := range benchTransports() {
			b.Run(fmt.Sprintf("%s/conns%d/64KiB", tr.name, conns), func(b *testing.B) {
				var cs, ss []net.Conn
				for i := 0; i < conns; i++ {
					c, s := tr.pair(b)
					cs, ss = append(cs, c), append(ss, s)
				}
				b.SetBytes(size)
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, 2*conns)
				for i := 0; i < conns; i++ {
					n := b.N / conns
					if i < b.N%conns {
						n++
					}
					wg.Add(2)
					go func(c net.Conn) {
						defer wg.Done()
						buf := make([]byte, size)
						for j := 0; j < n; j++ {
							if _, err := c.Write(buf); err != nil {
								errs <- err
								return
							}
						}
					}(cs[i])
					go func(s net.Conn) {
						defer wg.Done()
						buf := make([]byte, size)
						for left := n * size; left > 0; {
							k, err := s.Read(buf[:min(left, size)])
							if err != nil {
								errs <- err
								return
							}
							left -= k
						}
					}(ss[i])
				}
				wg.Wait()
				el := time.Since(start)
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)*size*8/el.Seconds()/1e9, "Gb/s")
			})
		}
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
