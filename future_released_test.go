package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: a released Future is safe until it is reused: every method
// returns at once, Wait and Err with ErrFutureReleased, the others the
// zero value (Done closed, Resolved true, so that a select or a poll
// goes on to Err), and a second Release does nothing. This holds for a
// Send's future, a Recv's whose Buffer went back first, and one that
// failed at the call.
func TestFutureUseAfterRelease(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()

	r := s.Recv()
	send := c.Send(b)
	require.NoError(t, send.Wait(ctx))
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, r.Buffer().Release())
	invalid := c.Send(nil)
	require.ErrorIs(t, invalid.Err(), rdma.ErrInvalid)

	for name, f := range map[string]*rdma.Future{"send": send, "recv": r, "failed at the call": invalid} {
		f.Release()
		for round := range 2 { // the second after a second Release
			start := time.Now()
			err := f.Wait(ctx)
			require.NotErrorIs(t, err, context.DeadlineExceeded, "%s: Wait after Release waited for its context", name)
			assert.ErrorIs(t, err, rdma.ErrFutureReleased, "%s round %d: Wait", name, round)
			assert.Less(t, time.Since(start), 5*time.Second, "%s: Wait after Release", name)
			assert.ErrorIs(t, f.Err(), rdma.ErrFutureReleased, "%s: Err", name)
			assert.True(t, f.Resolved(), "%s: Resolved", name)
			select {
			case <-f.Done():
			default:
				t.Errorf("%s: Done is open after Release", name)
			}
			assert.Zero(t, f.Len(), "%s: Len", name)
			imm, ok := f.Imm()
			assert.Zero(t, imm, "%s: Imm", name)
			assert.False(t, ok, "%s: Imm", name)
			assert.Nil(t, f.Buffer(), "%s: Buffer", name)
			assert.Zero(t, f.Old(), "%s: Old", name)
			assert.False(t, f.Cancel(), "%s: Cancel", name)
			f.Release() // a second Release does nothing
		}
	}

	// The connection still works, and the futures it hands out now,
	// reused or not, are its own.
	for range 4 {
		r := s.Recv()
		f := c.Send(b)
		require.NoError(t, f.Wait(ctx))
		require.NoError(t, r.Wait(ctx))
		assert.Equal(t, 64, r.Len())
		require.NoError(t, r.Buffer().Release())
		r.Release()
		f.Release()
	}
}

// Rule: Wait(nil) waits as Wait(context.Background()) does: on a future
// that resolves later and on one resolved already.
func TestFutureWaitNilContext(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := c.Alloc(8)
	require.NoError(t, err)
	defer b.Release()

	var nilCtx context.Context // what Wait(nil) does is the point
	r := s.Recv()
	got := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				got <- fmt.Errorf("Wait(nil) panicked: %v", p)
			}
		}()
		got <- r.Wait(nilCtx)
	}()
	require.NoError(t, c.Send(b).Wait(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Wait(nil) did not return once the Recv resolved")
	}
	require.NoError(t, r.Buffer().Release())
	assert.NoError(t, r.Wait(nilCtx), "resolved already")
	assert.ErrorIs(t, c.Send(nil).Wait(nilCtx), rdma.ErrInvalid)
}

// Rule: with the debug switch (GORDMA_DEBUG=futures) futures are never
// reused, and each use of one after its Release, a second Release among
// them, is reported with the stack of the use and that of the Release,
// while the use gets what it gets without the switch.
func TestFutureDebugReportsUseAfterRelease(t *testing.T) {
	reports := rdma.DebugFutures(t)
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := c.Alloc(8)
	require.NoError(t, err)
	defer b.Release()

	f := c.Send(b)
	require.NoError(t, f.Wait(ctx))
	releaseForDebugTest(f)
	require.Empty(t, reports(), "a Release is no use after Release")
	// Operations that would reuse f without the switch.
	for i := range 20 {
		r := s.Recv()
		g := c.Send(b)
		require.NotSame(t, f, g, "operation %d reused a released future", i)
		require.NoError(t, g.Wait(ctx))
		require.NoError(t, r.Wait(ctx))
		require.NotSame(t, f, r, "receive %d reused a released future", i)
		require.NoError(t, r.Buffer().Release())
		g.Release()
		r.Release()
	}
	reports() // the loop's own futures were used correctly: nothing to see
	err = useForDebugTest(f)
	require.ErrorIs(t, err, rdma.ErrFutureReleased)
	assert.Contains(t, err.Error(), "releaseForDebugTest", "the error names where the future was released")
	got := reports()
	require.Len(t, got, 1, "one report for one use")
	for _, want := range []string{"Future.Wait", "useForDebugTest", "future_released_test.go", "released at", "releaseForDebugTest"} {
		assert.Contains(t, got[0], want)
	}

	// Every method reports.
	f.Err()
	f.Done()
	f.Resolved()
	f.Len()
	f.Imm()
	f.Buffer()
	f.Old()
	f.Cancel()
	f.Release()
	got = reports()
	require.Len(t, got, 9)
	for i, m := range []string{"Err", "Done", "Resolved", "Len", "Imm", "Buffer", "Old", "Cancel", "Release"} {
		assert.Contains(t, got[i], "Future."+m+" after Release")
		assert.Contains(t, got[i], "releaseForDebugTest")
	}
	assert.True(t, errors.Is(f.Err(), rdma.ErrFutureReleased))
}

//go:noinline
func releaseForDebugTest(f *rdma.Future) { f.Release() }

//go:noinline
func useForDebugTest(f *rdma.Future) error { return f.Wait(context.Background()) }
