package poller

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// directChan is a fakeChan that can hand its events to a direct handler,
// as the soft provider's connection readers do: the events it gets while
// one is set wait in raised until the test, in the role of the reader,
// raises them (outside the CQ's lock, which post is called under).
type directChan struct {
	*fakeChan
	mu     sync.Mutex
	f      func(verbs.CQ)
	raised []verbs.CQ
}

func (c *directChan) SetDirect(f func(verbs.CQ)) {
	c.mu.Lock()
	c.f = f
	c.mu.Unlock()
}

func (c *directChan) direct() func(verbs.CQ) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.f
}

func (c *directChan) post(cq verbs.CQ) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f != nil {
		c.raised = append(c.raised, cq)
		return
	}
	c.fakeChan.post(cq)
}

// raise hands the events raised so far to the direct handler.
func (c *directChan) raise() int {
	c.mu.Lock()
	evs, f := c.raised, c.f
	c.raised = nil
	c.mu.Unlock()
	for _, cq := range evs {
		f(cq)
	}
	return len(evs)
}

// TestDirect: a parked poller takes a DirectChannel's events in the
// goroutine that raises them: the completions reach the handler there,
// the CQ is armed again, and the poller's goroutine never wakes. Close
// takes the handler back; Busy pollers, which never park on events,
// never set one.
func TestDirect(t *testing.T) {
	for _, m := range []Mode{Adaptive, Event} {
		t.Run(m.String(), func(t *testing.T) {
			ch := &directChan{fakeChan: newFakeChan()}
			ch.blocked = make(chan struct{}, 16)
			cq := newFakeCQ(64, ch)
			c := newCollector(8, 8)
			p := mustNew(t, cq, ch, c, Config{Mode: m, Spin: time.Microsecond})
			require.NotNil(t, ch.direct(), "the poller set no direct handler")
			waitOrFail(t, ch.blocked, "poller parks", p)

			for round := range 4 {
				require.True(t, cq.push1(uint64(2*round)))
				require.True(t, cq.push1(uint64(2*round+1)))
				require.Equal(t, 1, ch.raise(), "round %d: events raised", round)
			}
			waitOrFail(t, c.done, "all completions handled", p)
			s := p.Stats()
			require.EqualValues(t, 8, s.Direct)
			require.EqualValues(t, 0, s.Events, "the poller's goroutine took an event")
			cq.mu.Lock()
			armed := cq.armed
			cq.mu.Unlock()
			require.True(t, armed, "the CQ was left unarmed")
			require.Zero(t, ch.lost.Load())

			p.Close()
			require.Nil(t, ch.direct(), "Close left the direct handler set")
			c.exactlyOnce(t, 8)
		})
	}
	t.Run("busy", func(t *testing.T) {
		ch := &directChan{fakeChan: newFakeChan()}
		p := mustNew(t, newFakeCQ(64, ch), ch, newCollector(1, 1), Config{Mode: Busy})
		defer p.Close()
		require.Nil(t, ch.direct())
	})
}
