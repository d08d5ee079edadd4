package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/soft"
)

// fakeGrantee is a connection on an SRQ as the queue sees it: it takes
// what it is given, up to room, and counts the recalls it gets.
type fakeGrantee struct {
	room    int
	out     int64
	given   uint32
	recalls int
}

func (g *fakeGrantee) CreditRoom() int { return g.room - int(g.out) }
func (g *fakeGrantee) CreditCap() int  { return g.room }
func (g *fakeGrantee) Give(k int, ahead bool) {
	g.out += int64(k)
	g.given += uint32(k)
}
func (g *fakeGrantee) Given() uint32     { return g.given }
func (g *fakeGrantee) CreditsOut() int64 { return g.out }
func (g *fakeGrantee) Spare() bool       { return false }
func (g *fakeGrantee) WaitsForRoom() int { return 0 }
func (g *fakeGrantee) Recall()           { g.recalls++ }
func (g *fakeGrantee) LookQuiet() bool   { return false }
func (g *fakeGrantee) Failed() bool      { return false }

// TestRecallAllAfter: a connection given just what it asked for, which
// it then no longer needs, is neither Spare nor a waiting chain, so the
// targeted recalls pass it over, and its credits came back only with
// the decay look, once a second (TestBurstManyConns: the last
// connections of a 1,000-connection burst finished 0.6-1.4 s late; the
// path there was an ask netted outside the lock, TestAskCountsRacingGrants
// in internal/rc). Once the waiter the headroom is kept for has waited
// recallAllAfter, every connection that holds credits and does not wait
// is recalled, whatever left them there.
func TestRecallAllAfter(t *testing.T) {
	const depth = 8
	e, err := Open(Config{Port: 1}, soft.Provider, "")
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Release()) }()
	e.Cfg.SharedRecvs = depth
	holder, waiter := &fakeGrantee{room: 4}, &fakeGrantee{room: depth}
	s, err := e.SRQFor(64, holder)
	require.NoError(t, err)
	h := s.Hand()
	defer func() {
		s.Leave(waiter, 0, int(waiter.out))
		s.Leave(holder, 0, int(holder.out))
		h.Stop()
		require.NoError(t, e.DropSRQ(s))
	}()
	e.mu.Lock()
	s.join(waiter) // as SRQFor joins a connection
	e.mu.Unlock()

	s.Ask(holder, 4, 4, 4, holder.Given())
	require.EqualValues(t, 4, holder.out, "the holder is given what it asked for")
	s.Ask(waiter, depth, depth, depth, waiter.Given()) // a chain of the whole queue: it waits for the holder's 4
	require.Zero(t, waiter.out)
	for range int(recallAllAfter/srqRetry) - 1 {
		h.FireRetry()
	}
	assert.Zero(t, holder.recalls, "within recallAllAfter only connections that may hold spare credits are recalled")
	h.FireRetry()
	h.FireRetry()
	assert.Positive(t, holder.recalls, "the waiter waited recallAllAfter: the holder is recalled")
	assert.Zero(t, waiter.recalls, "not the waiter the headroom is kept for")
}

// TestTakesAheadDoNotWait: a connection that streams alone waits for
// what it asked for, and the credits of its takes are added to its wait,
// to give ahead. Once its cap cuts a grant and what is left is only
// those, it waits no more: it asked for nothing more, and its next takes
// give them anyway. It stayed in the queue, passed over until its peer's
// idle give-back a second on, and while it did every other connection
// gave each take's credit back on its own (OthersWait) and asked through
// the queue (TestBurstManyConns found one after a burst).
func TestTakesAheadDoNotWait(t *testing.T) {
	const depth, cap = 16, 4
	e, err := Open(Config{Port: 1}, soft.Provider, "")
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Release()) }()
	e.Cfg.SharedRecvs = depth
	c := &fakeGrantee{room: cap}
	s, err := e.SRQFor(64, c)
	require.NoError(t, err)
	h := s.Hand()
	defer func() {
		s.Leave(c, 0, int(c.out))
		h.Stop()
		require.NoError(t, e.DropSRQ(s))
	}()

	s.Ask(c, cap+2, 1, 1, c.Given())
	require.EqualValues(t, cap, c.out, "its cap cuts the grant")
	want, waits := h.Waiting(c)
	require.True(t, waits)
	require.Equal(t, 2, want, "it waits for the rest of what it asked for")

	// Its cap's messages arrive and are taken; their credits come back.
	for range cap {
		s.Arrived()
	}
	c.out -= cap
	s.Taken(cap)
	s.Regrant(c, cap)
	assert.EqualValues(t, cap, c.out, "served again up to its cap: the 2 it asked for and 2 of its takes")
	_, waits = h.Waiting(c)
	assert.False(t, waits, "only credits of its takes are left to give: it does not wait for them")
	assert.Zero(t, s.Stats().Waiting)
}
