package rdma

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHandshakesEvictIdle: a hello waiting for a slot gives up the
// handshake that has waited longest on its peer, once it has waited the
// grace and not before, one for each hello waiting; the hellos get the
// slots in the order they came, and one that stops waiting passes its
// slot on.
func TestHandshakesEvictIdle(t *testing.T) {
	const grace = 50 * time.Millisecond
	hs := &handshakes{grace: grace, free: 2}
	defer hs.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cuts := make(chan int, 2)
	var held []*handshake
	var since []time.Time
	for i := range 2 {
		h, err := hs.acquire(ctx)
		require.NoError(t, err)
		since = append(since, time.Now())
		h.waiting(func() { cuts <- i })
		held = append(held, h)
	}
	// A hello whose dialer gives up at once passes its turn on.
	gone, stop := context.WithCancel(ctx)
	stop()
	_, err := hs.acquire(gone)
	require.ErrorIs(t, err, context.Canceled)

	got := make(chan *handshake, 1)
	go func() {
		h, err := hs.acquire(ctx)
		assert.NoError(t, err)
		got <- h
	}()
	select {
	case i := <-cuts:
		require.Equal(t, 0, i, "the handshake that waited longest goes first")
		assert.GreaterOrEqual(t, time.Since(since[0]), grace, "given up before its grace")
	case <-ctx.Done():
		t.Fatal("no idle handshake was given up for the waiting hello")
	}
	require.True(t, held[0].release(), "released as given up")
	var h *handshake
	select {
	case h = <-got:
	case <-ctx.Done():
		t.Fatal("the waiting hello got no slot")
	}
	select {
	case i := <-cuts:
		t.Fatalf("handshake %d given up with no hello waiting", i)
	default:
	}
	assert.False(t, h.release())
	assert.False(t, held[1].release())
	hs.mu.Lock()
	defer hs.mu.Unlock()
	assert.Equal(t, 2, hs.free)
	assert.Zero(t, hs.queue.Len())
	assert.Zero(t, hs.idle.Len())
	assert.Zero(t, hs.evicting)
}
