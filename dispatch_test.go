package rdma_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: with a RecvHandler, a server with many connections keeps no
// goroutine per connection: the messages of 200 connections are handled
// on the engine's bounded worker pool, each connection's in order, and
// Recv refuses.
func TestRecvHandler(t *testing.T) { eachProvider(t, testRecvHandler) }

func testRecvHandler(t *testing.T, opts []rdma.Option) {
	const conns, msgs, handlerWorkers = 200, 5, 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	next := map[*rdma.Conn]uint32{}
	var wg sync.WaitGroup
	wg.Add(conns * msgs)
	var running, most atomic.Int32
	handler := func(c *rdma.Conn, f *rdma.Future) {
		defer wg.Done()
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		mu.Lock()
		imm, _ := f.Imm()
		assert.Equal(t, next[c], imm, "a connection's messages in order")
		next[c] = imm + 1
		mu.Unlock()
		runtime.Gosched() // let other workers overlap this one
		assert.NoError(t, f.Buffer().Release())
	}
	se, err := rdma.OpenEngine(append(opts, rdma.WithHandlerWorkers(handlerWorkers))...)
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(opts...)
	require.NoError(t, err)
	defer ce.Close()
	ln, err := se.Listen("rdma", "127.0.0.1:0", rdma.WithRecvHandler(handler), rdma.WithQueueDepth(8, 4))
	require.NoError(t, err)
	defer ln.Close()

	before := runtime.NumGoroutine()
	var clients, servers []*rdma.Conn
	dial := func(ctx context.Context, address string) (*rdma.Conn, error) {
		return ce.Dial(ctx, "rdma", address, rdma.WithQueueDepth(8, 4))
	}
	for range conns {
		c, s := rdmatest.Connect(t, ln, dial)
		clients, servers = append(clients, c), append(servers, s)
	}
	require.ErrorIs(t, servers[0].Recv().Err(), rdma.ErrInvalid)
	b, err := ce.Alloc(8)
	require.NoError(t, err)
	defer b.Release()
	var sends []*rdma.Future
	for i := range msgs {
		for _, c := range clients {
			sends = append(sends, c.SendWithImm(b, uint32(i)))
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("not every message reached the handler")
	}
	for _, f := range sends {
		require.NoError(t, f.Wait(ctx))
	}
	per := float64(runtime.NumGoroutine()-before) / conns
	t.Logf("%d connections on both sides: %.2f goroutines each, handlers at most %d at once", conns, per, most.Load())
	assert.LessOrEqual(t, most.Load(), int32(handlerWorkers))
}

// Rule: WithHandlerWorkers takes a bound of at least 1, and it is an
// engine setting: an Engine's connections cannot ask for another.
func TestWithHandlerWorkers(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	_, err := rdma.OpenEngine(soft, rdma.WithHandlerWorkers(0))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	e, err := rdma.OpenEngine(soft, rdma.WithHandlerWorkers(2))
	require.NoError(t, err)
	defer e.Close()
	_, err = e.Listen("rdma", "127.0.0.1:0", rdma.WithHandlerWorkers(3))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	ln, err := e.Listen("rdma", "127.0.0.1:0", rdma.WithHandlerWorkers(2))
	require.NoError(t, err, "the engine's own bound")
	require.NoError(t, ln.Close())
}
