package rdma_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: credits ride the data path. A connection that streams messages
// gets its credits back by RDMA WRITEs into its credit word, not by
// frames of the control channel: v0.1.0 sent a frame every eighth
// message, through the control worker on both sides, and the async
// API's SEND latency on rxe got 5x worse for it.
func TestCreditsInBand(t *testing.T) { eachProvider(t, testCreditsInBand) }

func testCreditsInBand(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 4000
	frames0, sframes0 := c.Stats().ControlFrames, s.Stats().ControlFrames
	// The sender keeps at most 16 messages the application has not
	// taken yet: well within the credit cap (64), so once it holds
	// credits it never runs short, and never needs to ask.
	window := make(chan struct{}, 16)
	got := make(chan error, 1)
	go func() {
		for range n {
			f := s.Recv()
			if err := f.Wait(ctx); err != nil {
				got <- err
				return
			}
			f.Buffer().Release()
			<-window
		}
		got <- nil
	}()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	var last *rdma.Future
	for range n {
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
			require.FailNow(t, "the receiver stalled")
		}
		last = c.Send(b)
	}
	require.NoError(t, last.Wait(ctx))
	require.NoError(t, <-got)
	cs, ss := c.Stats(), s.Stats()
	t.Logf("sender: %d frames, %d credit waits; receiver: %d frames, %d credit WRITEs", cs.ControlFrames-frames0, cs.CreditWaits, ss.ControlFrames-sframes0, ss.CreditWrites)
	assert.Positive(t, ss.CreditWrites, "no credit came back in band")
	// The first ask and its answer; v0.1.0 sent n/8 frames.
	assert.LessOrEqual(t, ss.ControlFrames-sframes0, uint64(2), "the receiver answered with frames")
	assert.LessOrEqual(t, cs.ControlFrames-frames0, uint64(2), "the sender asked with frames")
	assert.LessOrEqual(t, cs.CreditWaits, uint64(16), "the sender waited for credits after the first window")
}

// Rule: the credit word's rkey reaches exactly its 4 bytes, for remote
// write only: a peer can neither read it nor write past it.
func TestCreditWordScoped(t *testing.T) { eachProvider(t, testCreditWordScoped) }

func testCreditWordScoped(t *testing.T, opts []rdma.Option) {
	for _, tc := range []struct {
		name string
		do   func(ctx context.Context, c *rdma.Conn, w rdma.RemoteRegion, b *rdma.Buffer) error
	}{
		{"read", func(ctx context.Context, c *rdma.Conn, w rdma.RemoteRegion, b *rdma.Buffer) error {
			sl, err := b.Slice(0, 4)
			if err != nil {
				return err
			}
			return c.Read(sl, w).Wait(ctx)
		}},
		{"write past it", func(ctx context.Context, c *rdma.Conn, w rdma.RemoteRegion, b *rdma.Buffer) error {
			w.Len = 8
			return c.Write(b, w).Wait(ctx)
		}},
		{"atomic", func(ctx context.Context, c *rdma.Conn, w rdma.RemoteRegion, b *rdma.Buffer) error {
			w.Len = 8
			return c.FetchAdd(w, 1).Wait(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := rdmatest.Pair(t, opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			b, err := c.Alloc(8)
			require.NoError(t, err)
			defer b.Release()
			err = tc.do(ctx, c, rdma.CreditWord(s), b)
			require.Error(t, err)
			assert.True(t, errors.Is(err, rdma.ErrRemoteAccess) || errors.Is(err, rdma.ErrInvalid), "%v", err)
		})
	}
}
