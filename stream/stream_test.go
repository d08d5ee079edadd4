package stream_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// inVM reports whether the tests run in the emulated VM, where sizes are
// scaled down.
func inVM() bool { return os.Getenv("RDMA_VM") == "1" }

// makeStreamPipe makes stream pairs for nettest, which calls it in
// subtests of its own with no t to give rdmatest.StreamPair, and closes
// each pair at the end of its subtest.
func makeStreamPipe(addr string, opts []rdma.Option) nettest.MakePipe {
	return func() (c1, c2 net.Conn, stop func(), err error) {
		ln, err := stream.Listen("rdma", addr, opts...)
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			c, err := ln.(*stream.Listener).AcceptContext(ctx)
			ch <- res{c, err}
		}()
		c1, err = stream.Dial(ctx, "rdma", ln.Addr().String(), opts...)
		r := <-ch
		if err != nil || r.err != nil {
			if c1 != nil {
				c1.Close()
			}
			if r.c != nil {
				r.c.Close()
			}
			return nil, nil, nil, errors.Join(err, r.err)
		}
		stop = func() {
			c1.Close()
			r.c.Close()
		}
		return c1, r.c, stop, nil
	}
}

// TestStreamNettest runs x/net/nettest's conformance suite for net.Conn.
func TestStreamNettest(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		nettest.TestConn(t, makeStreamPipe(listenAddr(t), opts))
	})
}

// TestStreamBasic: bytes in order both ways, full-duplex, large writes
// pipelined past the window, EOF after CloseWrite, then the other way.
func TestStreamBasic(t *testing.T) { eachProvider(t, testStreamBasic) }

func testStreamBasic(t *testing.T, opts []rdma.Option) {
	c, s := streamPair(t, opts...)
	size := 8 << 20
	if inVM() {
		size = 1 << 20
	}
	a := make([]byte, size)
	b := make([]byte, size/2+12345)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range a {
		a[i] = byte(rnd.Uint32())
	}
	for i := range b {
		b[i] = byte(rnd.Uint32())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	// c → s and s → c at once, both ends half-closing.
	wg.Add(4)
	go func() {
		defer wg.Done()
		// Writes of odd sizes.
		for off := 0; off < len(a); {
			n := min(len(a)-off, 1+rnd2(off)%200000)
			if _, err := c.Write(a[off : off+n]); err != nil {
				errs <- err
				return
			}
			off += n
		}
		errs <- c.CloseWrite()
	}()
	go func() {
		defer wg.Done()
		if _, err := s.Write(b); err != nil {
			errs <- err
			return
		}
		errs <- s.CloseWrite()
	}()
	var gotA, gotB []byte
	go func() {
		defer wg.Done()
		var err error
		gotA, err = io.ReadAll(s)
		errs <- err
	}()
	go func() {
		defer wg.Done()
		var err error
		gotB, err = io.ReadAll(c)
		errs <- err
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(gotA, a) {
		t.Fatalf("c→s: got %d bytes, want %d (equal prefix %d)", len(gotA), len(a), commonPrefix(gotA, a))
	}
	if !bytes.Equal(gotB, b) {
		t.Fatalf("s→c: got %d bytes, want %d", len(gotB), len(b))
	}
	// After the peer's fin, Read keeps returning EOF; Write after
	// CloseWrite fails with EPIPE.
	if n, err := s.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("read after EOF: %d, %v", n, err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	if c.RDMAConn() == nil || c.RDMAConn().Provider() == "" {
		t.Fatal("no underlying conn")
	}
}

func rnd2(i int) int { return (i*7919 + 13) & 0x7fffffff }

func commonPrefix(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// TestStreamSmallWindow: the smallest queues (windows of one, two and
// five messages of 64 bytes) in both directions at once, with writes and reads of random
// sizes: every credit path is taken many times, and nothing stalls.
func TestStreamSmallWindow(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		for _, depth := range []int{7, 8, 11} {
			t.Run(fmt.Sprint("depth", depth), func(t *testing.T) {
				o := append(opts[:len(opts):len(opts)], rdma.WithQueueDepth(depth, depth), rdma.WithMaxMessage(64))
				c, s := streamPair(t, o...)
				size := 200 << 10
				if inVM() {
					size = 8 << 10
				}
				exchangeRandom(t, c, s, size, 300, 400, uint64(depth))
			})
		}
	})
}

// exchangeRandom sends size bytes each way between a and b at once, in
// Writes of 1 to maxWrite bytes and Reads of 1 to maxRead, sizes drawn
// from seed, and checks that each side reads exactly what the other
// wrote.
func exchangeRandom(t *testing.T, a, b net.Conn, size, maxWrite, maxRead int, seed uint64) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, p := range [][2]net.Conn{{a, b}, {b, a}} {
		w, r := p[0], p[1]
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(i % 251)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, 1))
			for off := 0; off < len(data); {
				n := min(len(data)-off, 1+rnd.IntN(maxWrite))
				if _, err := w.Write(data[off : off+n]); err != nil {
					errs <- err
					return
				}
				off += n
			}
		}()
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, 2))
			got := make([]byte, 0, len(data))
			buf := make([]byte, maxRead)
			for len(got) < len(data) {
				n, err := r.Read(buf[:1+rnd.IntN(len(buf))])
				if err != nil {
					errs <- err
					return
				}
				got = append(got, buf[:n]...)
			}
			if !bytes.Equal(got, data) {
				errs <- fmt.Errorf("bytes differ (equal prefix %d)", commonPrefix(got, data))
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(3 * time.Minute):
		// A stall: say where both sides are, then unblock the four.
		for _, c := range []net.Conn{a, b} {
			s := c.(*stream.Conn)
			st := s.RDMAConn().Stats()
			t.Errorf("stalled: %v: %s\n\trdma: %+v", s.LocalAddr(), stream.DebugState(s), st)
		}
		for _, e := range rdma.AllStats() {
			e.Connections = nil
			t.Errorf("engine: %+v", e)
		}
		a.Close()
		b.Close()
		<-finished
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Rule: a stream needs a reliable connection: Listen and Dial with
// rdma.WithTransport(rdma.UC) fail with ErrNotSupported naming it.
func TestStreamRefusesUC(t *testing.T) {
	_, err := stream.Listen("rdma", "127.0.0.1:0", rdma.WithProvider("soft"), rdma.WithTransport(rdma.UC))
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	assert.Contains(t, err.Error(), "UC")

	// A UC listener of the async API that names the stream's protocol,
	// so that only the transport can refuse the dial.
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider("soft"), rdma.WithTransport(rdma.UC), rdma.WithProtocol(stream.Protocol))
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		if c, err := ln.Accept(ctx); err == nil {
			c.Close()
		}
	}()
	_, err = stream.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithProvider("soft"), rdma.WithTransport(rdma.UC))
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	assert.Contains(t, err.Error(), "UC")
}
