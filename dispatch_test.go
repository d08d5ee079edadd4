package rdma_test

import (
	"context"
	"errors"
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
	var wg sync.WaitGroup
	wg.Add(conns * msgs)
	var oc orderCheck
	handler := func(c *rdma.Conn, f *rdma.Future) {
		defer wg.Done()
		oc.handle(t, c, f)
	}
	se, err := rdma.OpenEngine(append(engineOpts(opts), rdma.WithHandlerWorkers(handlerWorkers))...)
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
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
	t.Logf("%d connections on both sides: %.2f goroutines each, handlers at most %d at once", conns, per, oc.most.Load())
	assert.LessOrEqual(t, oc.most.Load(), int32(handlerWorkers))
}

// Rule: WithHandlerWorkers takes a bound of at least 1; it is an engine
// option (TestOptionKinds).
func TestWithHandlerWorkers(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	_, err := rdma.OpenEngine(soft, rdma.WithHandlerWorkers(0))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	e, err := rdma.OpenEngine(soft, rdma.WithHandlerWorkers(2))
	require.NoError(t, err)
	require.NoError(t, e.Close())
}

// countingPool is a HandlerPool of the test's: at most size tasks at
// once, each on a goroutine of its own, counted; a closed pool refuses
// tasks, as ants' does.
type countingPool struct {
	sem       chan struct{}
	wg        sync.WaitGroup
	submitted atomic.Int64
	closed    atomic.Bool
}

func newCountingPool(size int) *countingPool { return &countingPool{sem: make(chan struct{}, size)} }

var errPoolClosed = errors.New("pool closed")

func (p *countingPool) Submit(task func()) error {
	if p.closed.Load() {
		return errPoolClosed
	}
	p.submitted.Add(1)
	p.sem <- struct{}{}
	p.wg.Go(func() {
		defer func() { <-p.sem }()
		task()
	})
	return nil
}

// Rule: WithHandlerPool runs the handlers on the application's pool, a
// connection's messages still one at a time and in order, at most the
// pool's size at once; a pool that refuses (closed) leaves no message
// waiting: the engine's workers run them.
func TestHandlerPool(t *testing.T) {
	const conns, msgs, size = 20, 10, 2
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := newCountingPool(size)
	defer pool.wg.Wait()
	got := make(chan struct{}, conns*msgs)
	var oc orderCheck
	handler := func(c *rdma.Conn, f *rdma.Future) {
		oc.handle(t, c, f)
		got <- struct{}{}
	}
	soft := rdma.WithProvider(rdma.ProviderSoft)
	se, err := rdma.OpenEngine(soft)
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(soft)
	require.NoError(t, err)
	defer ce.Close()
	ln, err := se.Listen("rdma", "127.0.0.1:0", rdma.WithRecvHandler(handler), rdma.WithHandlerPool(pool))
	require.NoError(t, err)
	defer ln.Close()
	var clients []*rdma.Conn
	for range conns {
		c, _ := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
			return ce.Dial(ctx, "rdma", address)
		})
		clients = append(clients, c)
	}
	b, err := ce.Alloc(8)
	require.NoError(t, err)
	defer b.Release()
	send := func(round int) {
		t.Helper()
		for _, c := range clients {
			require.NoError(t, c.SendWithImm(b, uint32(round)).Wait(ctx))
		}
		for range conns {
			select {
			case <-got:
			case <-ctx.Done():
				require.FailNow(t, "a message was not handled")
			}
		}
	}
	for i := range msgs / 2 {
		send(i)
	}
	assert.Positive(t, pool.submitted.Load(), "no handler ran on the pool")
	assert.LessOrEqual(t, oc.most.Load(), int32(size), "more handlers at once than the pool runs")
	// A pool that refuses: the engine's workers run the handlers.
	pool.closed.Store(true)
	submitted := pool.submitted.Load()
	for i := msgs / 2; i < msgs; i++ {
		send(i)
	}
	assert.Equal(t, submitted, pool.submitted.Load(), "a closed pool took tasks")
}

// orderCheck is a RecvHandler's body for the tests above: it checks that
// each connection's messages come in order (their immediate values count
// up from 0), lets other handlers overlap it, releases the buffer, and
// keeps the most handlers that ran at once.
type orderCheck struct {
	mu            sync.Mutex
	next          map[*rdma.Conn]uint32
	running, most atomic.Int32
}

func (oc *orderCheck) handle(t *testing.T, c *rdma.Conn, f *rdma.Future) {
	n := oc.running.Add(1)
	defer oc.running.Add(-1)
	for m := oc.most.Load(); n > m && !oc.most.CompareAndSwap(m, n); m = oc.most.Load() {
	}
	oc.mu.Lock()
	if oc.next == nil {
		oc.next = map[*rdma.Conn]uint32{}
	}
	imm, _ := f.Imm()
	assert.Equal(t, oc.next[c], imm, "a connection's messages in order")
	oc.next[c] = imm + 1
	oc.mu.Unlock()
	runtime.Gosched() // let other workers overlap this one
	assert.NoError(t, f.Buffer().Release())
}
