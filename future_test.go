package rdma

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Rule: a future resolves once; every waiter (Wait, Done, several at
// once) sees it; a Wait whose context ends returns at once and leaves the
// future to resolve later.
func TestFutureWaiters(t *testing.T) {
	for round := 0; round < 200; round++ {
		f := &Future{}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- f.Wait(context.Background())
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-f.Done()
			errs <- f.Err()
		}()
		want := errors.New("boom")
		if !f.resolve(want, 1, 0, false, nil, 0) || f.resolve(nil, 2, 0, false, nil, 0) {
			t.Fatal("resolve must succeed exactly once")
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != want {
				t.Fatalf("waiter saw %v", err)
			}
		}
	}
	f := &Future{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := f.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with an expiring context: %v", err)
	}
	// A cancelled Wait must leave a clean state for the next one.
	done := make(chan error)
	go func() { done <- f.Wait(context.Background()) }()
	f.resolve(nil, 3, 0, false, nil, 0)
	if err := <-done; err != nil || f.Len() != 3 {
		t.Fatalf("Wait after a cancelled Wait: %v, len %d", err, f.Len())
	}
}

// Rule: waiting on a pending future allocates nothing once warm.
func TestFutureWaitAllocs(t *testing.T) {
	const runs = 200
	futures := make([]Future, runs+1)
	next := make(chan *Future)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // the "poller": resolves each future it is handed
		for {
			select {
			case f := <-next:
				f.resolve(nil, 1, 0, false, nil, 0)
			case <-stop:
				return
			}
		}
	}()
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		f := &futures[i]
		i++
		next <- f
		f.Wait(context.Background())
	})
	if allocs != 0 {
		t.Errorf("Wait allocated %.1f times per call", allocs)
	}
}
