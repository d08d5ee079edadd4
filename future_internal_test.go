package rdma

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/rc"
)

// TestResolveOpStale: an op issued before its future was released and
// reused does not resolve the future's next operation (a failed chain's
// futures resolve at once, and again as its WRs flush).
func TestResolveOpStale(t *testing.T) {
	f := newFuture(nil)
	stale := rc.Op{Fut: (*opFuture)(f), Gen: f.gen}
	stale.Resolve(nil, 8, 0)
	assert.True(t, f.Resolved())
	// What Release and the next newFuture do, without giving f to
	// futurePool: resolving a future that sits in the pool would hand
	// the next test's Recv a resolved future (a message delivered to
	// it was lost, and its engine never drained).
	f.mu.Lock()
	f.releaseLocked(ErrFutureReleased)
	f.mu.Unlock()
	stale.Resolve(errors.New("a flush of the old chain"), 0, 0)
	assert.ErrorIs(t, f.Err(), ErrFutureReleased, "the stale op reached the released future")
	f.reuse(nil)
	assert.False(t, f.Resolved(), "reset for the next operation")
	next := rc.Op{Fut: (*opFuture)(f), Gen: f.gen}
	stale.Resolve(errors.New("a flush of the old chain"), 0, 0)
	assert.False(t, f.Resolved(), "the stale op reached the next operation")
	next.Resolve(nil, 4, 0)
	assert.NoError(t, f.Err())
	assert.Equal(t, 4, f.Len())
}

// BenchmarkFutureCycle is a future's own cost in a loop that releases
// its futures: take one, resolve it as a completion does, Wait, read
// its results, Release.
func BenchmarkFutureCycle(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		f := newFuture(nil)
		f.resolve(nil, 8, 0, false, nil, 0)
		if err := f.Wait(ctx); err != nil || f.Len() != 8 {
			b.Fatal(err)
		}
		f.Release()
	}
}

// futureResolver is the call a connection in a package below the API
// would make to resolve an operation's Future, were the Future to stay
// in the API's package: an interface call.
type futureResolver interface {
	resolve(err error, n int, imm uint32, hasImm bool, pb *pool.Buffer, old uint64) bool
}

// BenchmarkFutureResolve measures what resolving an operation's Future
// costs called directly (the Future in the connection's package, or an
// alias of it) and through an interface (the Future in the API's
// package, the connection below it), to decide where Future lives
// (docs/architecture.md). Each resolves a Future and gives it back.
func BenchmarkFutureResolve(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			f := newFuture(nil)
			f.resolve(nil, 8, 0, false, nil, 0)
			f.Release()
		}
	})
	b.Run("interface", func(b *testing.B) {
		for b.Loop() {
			f := newFuture(nil)
			var r futureResolver = f
			r.resolve(nil, 8, 0, false, nil, 0)
			f.Release()
		}
	})
}
