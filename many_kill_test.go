package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/testchild"
)

// Rule: when a process holding 1,000 connections is SIGKILLed, every
// future of every connection resolves with ErrPeerLost in bounded
// time, and closing them leaves no goroutine, buffer or descriptor.
func TestManyConnsPeerKilled(t *testing.T) { eachProvider(t, testManyConnsPeerKilled) }

func testManyConnsPeerKilled(t *testing.T, opts []rdma.Option) {
	n := 1000
	if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
		n = 200 // on an emulated CPU
	}
	if lim := raiseFDLimit(t); n+500 > lim {
		n = lim - 500
	}
	opts = append(opts, rdma.WithQueueDepth(16, 4), rdma.WithMaxMessage(4096))
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	e, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	provider := e.Provider()
	ln, err := e.Listen("rdma", "127.0.0.1:0", listenOpts(opts)...)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	child := testchild.Start(ctx, t, "hold", "RDMA_TEST_ADDR="+ln.Addr().String(),
		fmt.Sprintf("RDMA_TEST_N=%d", n), "RDMA_TEST_PROVIDER="+provider)
	conns := make([]*rdma.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := ln.Accept(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	child.Expect(t, "ready")

	// On each connection: a Recv that nothing answers, and more sends
	// than the child, which never reads, has credits for.
	var futures []*rdma.Future
	bufs := make([]*rdma.Buffer, n)
	for i, c := range conns {
		bufs[i], err = c.Alloc(64)
		require.NoError(t, err)
		defer bufs[i].Release()
		futures = append(futures, c.Recv())
		for range 8 {
			futures = append(futures, c.Send(bufs[i]))
		}
	}
	child.Kill(t)
	start := time.Now()
	for i, f := range futures {
		if err := f.Wait(ctx); err != nil && !errors.Is(err, rdma.ErrPeerLost) {
			t.Fatalf("future %d failed with %v, want ErrPeerLost", i, err)
		}
	}
	failed := 0
	for _, f := range futures {
		if f.Err() != nil {
			failed++
		}
	}
	t.Logf("%d connections: %d of %d futures failed with ErrPeerLost, all resolved %v after SIGKILL", n, failed, len(futures), time.Since(start).Round(time.Millisecond))
	// Every Recv and the sends past the child's credits (4 of 8) failed.
	assert.GreaterOrEqual(t, failed, 5*n)
	for _, c := range conns {
		<-c.Done()
		require.ErrorIs(t, c.Err(), rdma.ErrPeerLost)
	}
	for i, c := range conns {
		require.NoError(t, bufs[i].Release())
		require.NoError(t, c.Close())
	}
	conns = nil
	require.NoError(t, ln.Close())
	assert.Zero(t, e.PoolStats().BuffersInUse, "buffers in use after close")
	require.NoError(t, e.Close())
	settled(t, g0, fd0)
}

// Rule: opening and closing 1,000 connections, in waves, each used
// once, leaves no goroutine, buffer or descriptor behind.
func TestConnChurn(t *testing.T) { eachProvider(t, testConnChurn) }

func testConnChurn(t *testing.T, opts []rdma.Option) {
	waves, size := 10, 100
	if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
		waves, size = 4, 50 // on an emulated CPU
	}
	opts = append(opts, rdma.WithQueueDepth(8, 4), rdma.WithMaxMessage(4096))
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	se, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	for w := range waves {
		clients, servers := enginePairs(t, ce, se, size, opts...)
		exercise(t, clients, servers)
		var wg sync.WaitGroup
		for i := range clients {
			// Either side closes first.
			a, b := clients[i], servers[i]
			if i%2 == 1 {
				a, b = b, a
			}
			wg.Go(func() {
				assert.NoError(t, a.Close())
				assert.NoError(t, b.Close())
			})
		}
		wg.Wait()
		require.Zero(t, se.PoolStats().BuffersInUse, "wave %d: server buffers in use", w)
		require.Zero(t, ce.PoolStats().BuffersInUse, "wave %d: client buffers in use", w)
	}
	require.NoError(t, se.Close())
	require.NoError(t, ce.Close())
	settled(t, g0, fd0)
}

// settled waits (bounded) for the goroutines and descriptors to come
// back to what they were: those of closed connections end shortly after
// Close returns.
func settled(t *testing.T, g0, fd0 int) {
	t.Helper()
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= g0+2 }, 10*time.Second, 10*time.Millisecond,
		"goroutines: %d, %d before", runtime.NumGoroutine(), g0)
	require.Eventually(t, func() bool { return openFDs(t) <= fd0+2 }, 10*time.Second, 10*time.Millisecond,
		"descriptors: %d, %d before", openFDs(t), fd0)
}

// holdChild dials $RDMA_TEST_N connections to $RDMA_TEST_ADDR, says
// "ready", and waits to be killed, reading nothing.
func holdChild() int {
	n, _ := strconv.Atoi(os.Getenv("RDMA_TEST_N"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e, err := rdma.OpenEngine(rdma.WithProvider(os.Getenv("RDMA_TEST_PROVIDER")))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	for i := range n {
		if _, err := e.Dial(ctx, "rdma", os.Getenv("RDMA_TEST_ADDR"), rdma.WithQueueDepth(16, 4), rdma.WithMaxMessage(4096)); err != nil {
			fmt.Fprintf(os.Stderr, "child: dial %d: %v\n", i, err)
			return 1
		}
	}
	fmt.Println("ready")
	<-ctx.Done() // killed long before this
	return 1
}
