package rdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// srqIdleHeadroom is the least headroom of receives a shared receive
// queue keeps posted beyond its credits (srqHeadroom in srq.go); it
// grows to a quarter of them.
const srqIdleHeadroom = 16

// Rule: receives posted on the shared receive queue follow the load
// down while the connections stay open. Once a burst over many
// connections is over, the queue takes back by itself, within seconds,
// the receives its credits no longer need, and their memory goes back
// with the pool's decay; Trim takes them at once. The connections work
// as before afterwards. After 40 connections' bursts, the queue once
// kept 72 MiB registered 30 s later.
func TestReceivesFollowLoad(t *testing.T) { eachProvider(t, testReceivesFollowLoad) }

func testReceivesFollowLoad(t *testing.T, opts []rdma.Option) {
	se, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, se.Close()) }()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ce.Close()) }()
	clients, accepted := enginePairs(t, ce, se, 40, opts...)
	servers := peers(t, clients, accepted)
	defer func() {
		for i := range clients {
			assert.NoError(t, clients[i].Close())
			assert.NoError(t, servers[i].Close())
		}
	}()

	burst(t, clients, servers, 100)
	peak, peakPool := rdma.SharedRecvStats(servers[0]), se.PoolStats()
	t.Logf("after the burst: SRQ %+v, pool %+v", peak, peakPool)
	require.Greater(t, peak.Posted, int64(4*srqIdleHeadroom), "the burst needed more receives than an idle queue keeps")

	// By itself: the credits come back after a second idle, the
	// receives behind them a second or two later (an idle queue keeps
	// none), then the pool's slabs.
	var idle rdma.SRQStats
	if !assert.Eventually(t, func() bool {
		idle = rdma.SharedRecvStats(servers[0])
		return idle.Granted+idle.Held == 0 && idle.Posted == 0
	}, 20*time.Second, 10*time.Millisecond) {
		require.FailNow(t, "receives posted long after the load stopped", "%+v", idle)
	}
	assert.Positive(t, idle.Withdrawn, "%+v", idle)
	var pool rdma.PoolStats
	if !assert.Eventually(t, func() bool {
		pool = se.PoolStats()
		return pool.BytesRegistered == 0
	}, 20*time.Second, 10*time.Millisecond) {
		require.FailNow(t, "registered long after the load stopped", "%+v, at the peak %+v", pool, peakPool)
	}
	t.Logf("idle: SRQ %+v, pool %+v", idle, se.PoolStats())

	// The receives come back with the load, and go at once on Trim: once
	// the senders have given their credits back (a second idle), before
	// the queue's own look takes them.
	burst(t, clients, servers, 100)
	var before rdma.SRQStats
	require.Eventually(t, func() bool {
		before = rdma.SharedRecvStats(servers[0])
		return before.Granted+before.Held == 0
	}, 20*time.Second, time.Millisecond, "credits still out long after the burst")
	require.NoError(t, se.Trim())
	q := rdma.SharedRecvStats(servers[0])
	// What the credits out need and the refill's headroom: a sender may
	// ask again meanwhile.
	g := q.Granted + q.Held
	assert.LessOrEqual(t, q.Posted, g+max(srqIdleHeadroom, g/4), "posted beyond the credits out after Trim: %+v", q)
	if before.Posted > 0 {
		assert.Greater(t, q.Withdrawn, before.Withdrawn, "Trim took nothing: before %+v, after %+v", before, q)
	}
	t.Logf("trimmed: SRQ %+v, pool %+v", q, se.PoolStats())
	burst(t, clients, servers, 100)
	st := rdma.SharedRecvStats(servers[0])
	assert.Zero(t, servers[0].Stats().RecvFailed, "%+v", st)
}

// Rule: credits given back to a sender that has gone quiet come back to
// the receiver. The sender reads its credit word when it sends or at its
// idle look; credits written after its last look (the application took
// the messages later) kept the receives behind them posted for ever,
// until the receiver's decay look recalled them (it failed so in the
// VM: Granted 8 twenty seconds after a burst).
func TestQuietSenderCreditsComeBack(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithQueueDepth(64, 16))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	var last *rdma.Future
	for range 16 { // the cap: the credits run out with the last
		last = c.Send(b)
	}
	require.NoError(t, last.Wait(ctx))
	require.Eventually(t, func() bool { return !rdma.CreditIdleArmed(c) }, 10*time.Second, 5*time.Millisecond,
		"the sender's idle look stops once it holds no credits")
	for range 16 { // now their credits go into the quiet sender's word
		r := s.Recv()
		require.NoError(t, r.Wait(ctx))
		require.NoError(t, r.Buffer().Release())
	}
	var q rdma.SRQStats
	assert.Eventually(t, func() bool {
		q = rdma.SharedRecvStats(s)
		return q.Granted+q.Held == 0
	}, 10*time.Second, 10*time.Millisecond, "credits of a quiet sender stayed out")
	t.Logf("%+v", q)
}
