package rdma_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: with a Busy poller, Wait runs to completion: the waiting
// goroutine polls the CQ itself (poller/drive.go). Every operation still
// completes exactly once whether its future is waited on, selected on
// through Done, or raced by several goroutines.
func TestBusyRunToCompletion(t *testing.T) { eachProvider(t, testBusyRunToCompletion) }

func testBusyRunToCompletion(t *testing.T, opts []rdma.Option) {
	opts = append(opts[:len(opts):len(opts)], rdma.WithPollMode(rdma.PollBusy))
	t.Run("sendrecv", func(t *testing.T) { testSendRecv(t, opts) })
	t.Run("onesided", func(t *testing.T) { testOneSided(t, opts) })

	t.Run("pingpong", func(t *testing.T) {
		c, s := rdmatest.Pair(t, opts...)
		const rounds = 200
		b, err := c.Alloc(64)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		sb, err := s.Alloc(64)
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Release()
		errc := make(chan error, 1)
		go func() { // the server echoes
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for range rounds {
				rf := s.Recv()
				if err := rf.Wait(ctx); err != nil {
					errc <- err
					return
				}
				copy(sb.Bytes(), rf.Buffer().Bytes())
				rf.Buffer().Release()
				if err := s.Send(sb).Wait(ctx); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for i := range rounds {
			for j := range b.Bytes() {
				b.Bytes()[j] = byte(i + j)
			}
			rf := c.Recv()
			wait(t, c.Send(b))
			wait(t, rf)
			if got := rf.Buffer().Bytes(); !bytes.Equal(got, b.Bytes()) {
				t.Fatalf("round %d: echo differs", i)
			}
			rf.Buffer().Release()
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if st := rdma.ConnPollerStats(c); st.Drives == 0 || st.Driven == 0 {
			t.Fatalf("Wait never drove the Busy poller: %+v", st)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		c, s := rdmatest.Pair(t, opts...)
		const waiters, per = 6, 40
		const total = (waiters + 1) * per // one more goroutine selects on Done
		received := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			seen := map[uint32]bool{}
			for range total {
				rf := s.Recv()
				if err := rf.Wait(ctx); err != nil {
					received <- err
					return
				}
				imm, _ := rf.Imm()
				seen[imm] = true
				rf.Buffer().Release()
			}
			if len(seen) != total {
				t.Errorf("received %d distinct messages, want %d", len(seen), total)
			}
			received <- nil
		}()
		var wg sync.WaitGroup
		for g := range waiters + 1 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, err := c.Alloc(32)
				if err != nil {
					t.Error(err)
					return
				}
				defer b.Release()
				for i := range per {
					f := c.SendWithImm(b, uint32(g*per+i))
					if g == waiters {
						select {
						case <-f.Done():
						case <-time.After(20 * time.Second):
							t.Error("a future selected on through Done never resolved")
							return
						}
						if f.Err() != nil {
							t.Error(f.Err())
							return
						}
						continue
					}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					err := f.Wait(ctx)
					cancel()
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := <-received; err != nil {
			t.Fatal(err)
		}
	})
}
