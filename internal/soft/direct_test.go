package soft

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// TestDirectEvents: the event of a completion that a connection reader
// produces (here the ACK of a WRITE to a QP over TCP) goes to the
// channel's direct handler, in the reader's goroutine, and not to
// GetEvent; the event of a completion produced elsewhere (in-process, in
// PostSend's goroutine) goes to GetEvent as before; and without a direct
// handler, a reader's event goes to GetEvent too.
func TestDirectEvents(t *testing.T) {
	for _, c := range []struct {
		name      string
		transport string
		direct    bool
	}{
		{"tcp", "tcp", true},
		{"inproc", "", false},
		{"tcp-unset", "tcp", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(EnvTransport, c.transport)
			a := newSide(t, sideOpt{channel: true})
			b := newSide(t, sideOpt{})
			connect(t, a, b, connOpt{})
			ch, ok := a.ch.(verbs.DirectChannel)
			require.True(t, ok, "the soft channel is no DirectChannel")
			got := make(chan verbs.CQ, 4)
			if c.name != "tcp-unset" {
				ch.SetDirect(func(cq verbs.CQ) { got <- cq })
				t.Cleanup(func() { ch.SetDirect(nil) })
			}
			for round := range 3 {
				must(t, a.scq.ReqNotify(false))
				a.post(verbs.SendWR{ID: uint64(round), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
				if c.direct {
					select {
					case cq := <-got:
						require.Equal(t, a.scq, cq)
					case <-time.After(10 * time.Second):
						t.Fatal("no direct event")
					}
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					cq, err := a.ch.GetEvent(ctx)
					cancel()
					require.NoError(t, err)
					require.Equal(t, a.scq, cq)
					cq.AckEvents(1)
					require.Empty(t, got, "a direct event for an in-process completion")
				}
				wc := pollOK(t, a.scq)
				require.Equal(t, uint64(round), wc.WRID)
			}
			if c.direct {
				// No event went to GetEvent meanwhile.
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				defer cancel()
				_, err := a.ch.GetEvent(ctx)
				require.ErrorIs(t, err, context.DeadlineExceeded)
			}
		})
	}
}
