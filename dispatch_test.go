package rdma_test

import (
	"context"
	"runtime"
	"sync"
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
	const conns, msgs = 200, 5
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	next := map[*rdma.Conn]uint32{}
	var wg sync.WaitGroup
	wg.Add(conns * msgs)
	running, most := 0, 0
	handler := func(c *rdma.Conn, f *rdma.Future) {
		defer wg.Done()
		mu.Lock()
		running++
		most = max(most, running)
		imm, _ := f.Imm()
		assert.Equal(t, next[c], imm, "a connection's messages in order")
		next[c] = imm + 1
		running--
		mu.Unlock()
		assert.NoError(t, f.Buffer().Release())
	}
	se, err := rdma.OpenEngine(opts...)
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
	t.Logf("%d connections on both sides: %.2f goroutines each, handlers at most %d at once", conns, per, most)
	assert.LessOrEqual(t, most, rdma.HandlerWorkers)
}
