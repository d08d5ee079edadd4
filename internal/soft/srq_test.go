package soft

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// srqRig is a sender and a receiver QP whose receives come from one SRQ.
type srqRig struct {
	t        *testing.T
	ctx      verbs.Context
	srq      verbs.SRQ
	mr       verbs.MR
	snd, rcv *side
	nextID   uint64
}

func newSRQRig(t *testing.T, maxWR int) *srqRig {
	ctx, err := Provider.Open(DeviceName)
	require.NoError(t, err)
	t.Cleanup(func() { mustClose(t, ctx) })
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { mustClose(t, pd) })
	srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: maxWR, MaxSGE: 1})
	require.NoError(t, err)
	t.Cleanup(func() { mustClose(t, srq) })
	buf := mapMem(t, 4096)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	require.NoError(t, err)
	t.Cleanup(func() { mustClose(t, mr) })
	r := &srqRig{t: t, ctx: ctx, srq: srq, mr: mr}
	r.rcv = newSide(t, sideOpt{ctx: ctx, pd: pd, srq: srq})
	r.snd = newSide(t, sideOpt{})
	connect(t, r.snd, r.rcv, connOpt{rnrRetry: 7})
	return r
}

// post puts n receives on the SRQ.
func (r *srqRig) post(n int) {
	wrs := make([]verbs.RecvWR, n)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: r.nextID, SGL: []verbs.SGE{{Addr: r.mr.Addr(), Length: 64, LKey: r.mr.LKey()}}}
		r.nextID++
	}
	k, err := r.srq.PostRecv(wrs)
	require.NoError(r.t, err)
	require.Equal(r.t, n, k)
}

// consume sends n messages and waits for their receive completions,
// which come after any limit event their receives raised.
func (r *srqRig) consume(n int) {
	for range n {
		r.snd.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{r.snd.sge(0, 8)}})
		pollOK(r.t, r.snd.scq)
		pollOK(r.t, r.rcv.rcq)
	}
}

// limitEvents drains the queued async events and counts the limit events
// naming r's SRQ. The soft provider queues the event before it completes
// the receive and AsyncEvent hands out queued events before it looks at
// its context, so a cancelled context reads exactly what is queued.
func (r *srqRig) limitEvents() int {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	n := 0
	for {
		ev, err := r.ctx.AsyncEvent(done)
		if err != nil {
			require.ErrorIs(r.t, err, context.Canceled)
			return n
		}
		if ev.Type == verbs.EventSRQLimitReached {
			assert.Equal(r.t, r.srq, ev.SRQ, "the limit event names another SRQ")
			n++
		}
	}
}

func TestSRQLimit(t *testing.T) {
	transports(t, func(t *testing.T) {
		r := newSRQRig(t, 16)
		r.post(8)
		require.NoError(t, r.srq.SetLimit(4))

		r.consume(4) // 8 -> 4: not below the limit
		assert.Zero(t, r.limitEvents(), "event while at the limit")
		r.consume(1) // 4 -> 3
		assert.Equal(t, 1, r.limitEvents(), "crossing the limit")
		r.consume(2) // disarmed
		assert.Zero(t, r.limitEvents(), "event after the one-shot fired")

		// Refill and re-arm: it fires again.
		r.post(7) // 8
		require.NoError(t, r.srq.SetLimit(6))
		r.consume(3) // 8 -> 5
		assert.Equal(t, 1, r.limitEvents(), "crossing the re-armed limit")

		// Arming replaces the armed limit; 0 disarms.
		r.post(3) // 8
		require.NoError(t, r.srq.SetLimit(7))
		require.NoError(t, r.srq.SetLimit(2))
		r.consume(2) // 8 -> 6: below 7, not below 2
		assert.Zero(t, r.limitEvents(), "the replaced limit fired")
		require.NoError(t, r.srq.SetLimit(0))
		r.consume(6) // 6 -> 0
		assert.Zero(t, r.limitEvents(), "a disarmed limit fired")

		// Armed below the watermark: reported at the next receive taken.
		r.post(2)
		require.NoError(t, r.srq.SetLimit(5))
		assert.Zero(t, r.limitEvents(), "arming below the watermark reported before a receive was taken")
		r.consume(1)
		assert.Equal(t, 1, r.limitEvents(), "armed below the watermark, then a receive taken")
	})
}

func TestSRQLimitArgs(t *testing.T) {
	r := newSRQRig(t, 16)
	maxWR := r.srq.MaxWR()
	for _, l := range []int{-1, maxWR, maxWR + 1} {
		assert.ErrorIs(t, r.srq.SetLimit(l), verbs.ErrInvalid, "SetLimit(%d), MaxWR %d", l, maxWR)
	}
	assert.NoError(t, r.srq.SetLimit(maxWR-1))
	assert.NoError(t, r.srq.SetLimit(0))

	pd, err := r.ctx.AllocPD()
	require.NoError(t, err)
	defer mustClose(t, pd)
	srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	require.NoError(t, srq.Close())
	assert.ErrorIs(t, srq.SetLimit(1), verbs.ErrClosed)
}

// TestSRQLimitConcurrent re-arms while receives are taken, for the race
// detector, and checks that each arming yields at most one event.
func TestSRQLimitConcurrent(t *testing.T) {
	const rounds = 50
	r := newSRQRig(t, 64)
	r.post(64)
	require.NoError(t, r.srq.SetLimit(63)) // so at least one event is due
	arms := 1
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if r.srq.SetLimit(63) == nil {
				arms++
			}
			runtime.Gosched()
		}
	}()
	for range rounds {
		r.consume(2) // 64 -> 62, below the limit if armed
		r.post(2)
	}
	close(stop)
	wg.Wait()
	got := r.limitEvents()
	assert.LessOrEqual(t, got, arms, "more limit events than armings")
	assert.Positive(t, got, "no limit event although the SRQ was armed and went below the limit")
}
