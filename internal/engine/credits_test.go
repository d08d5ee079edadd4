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
