package rdma_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// stream sends n messages carrying (id, seq) from c to s and checks that
// s gets exactly them, in order: no message of another connection.
func streamMessages(ctx context.Context, c, s *rdma.Conn, id uint32, n int, onRecv func()) error {
	sent := make(chan error, 1)
	go func() {
		b, err := c.Alloc(8)
		if err != nil {
			sent <- err
			return
		}
		defer b.Release()
		binary.BigEndian.PutUint32(b.Bytes(), id)
		var last *rdma.Future
		for i := range n {
			last = c.SendWithImm(b, uint32(i))
		}
		sent <- last.Wait(ctx)
	}()
	for i := range n {
		r := s.Recv()
		if err := r.Wait(ctx); err != nil {
			return fmt.Errorf("connection %d, message %d: %w", id, i, err)
		}
		imm, _ := r.Imm()
		got := binary.BigEndian.Uint32(r.Buffer().Bytes())
		r.Buffer().Release()
		if got != id || imm != uint32(i) {
			return fmt.Errorf("connection %d, message %d: got message %d of connection %d", id, i, imm, got)
		}
		if onRecv != nil {
			onRecv()
		}
	}
	return <-sent
}

// Rule: the shared receive queue is refilled at its low watermark by the
// device's limit event alone, and by the check after a poll alone.
func TestSRQRefill(t *testing.T) { eachProvider(t, testSRQRefill) }

func testSRQRefill(t *testing.T, opts []rdma.Option) {
	for _, path := range []string{"event", "poll"} {
		t.Run(path, func(t *testing.T) {
			defer rdma.SetSRQRefill(path == "event", path == "poll")()
			c, s := rdmatest.Pair(t, append(opts, rdma.WithQueueDepth(64, 32), rdma.WithSharedReceives(128), rdma.WithMaxMessage(1024))...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			require.NoError(t, streamMessages(ctx, c, s, 1, 2000, nil))
			st := rdma.SharedRecvStats(s)
			t.Logf("%s: refills by event %d, by poll %d, by grant %d", path, st.Refills[0], st.Refills[1], st.Refills[2])
			if path == "event" {
				assert.Positive(t, st.Refills[0], "refills by the limit event")
				assert.Zero(t, st.Refills[1], "refills after a poll (turned off)")
			} else {
				assert.Positive(t, st.Refills[1], "refills after a poll")
				assert.Zero(t, st.Refills[0], "refills by the limit event (turned off)")
			}
			assert.LessOrEqual(t, st.Posted, int64(128))
		})
	}
}

// Rule: when the check after each poll keeps the SRQ filled, the device's
// limit event stays quiet. It was armed at the check's own watermark, so
// in a ping-pong both fired about once every eighth message: the event
// woke the engine's event reader, and each refill armed the limit again
// with a system call on rxe. It is armed deeper now, and only again once
// it fired.
func TestSRQLimitQuiet(t *testing.T) { eachProvider(t, testSRQLimitQuiet) }

func testSRQLimitQuiet(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithQueueDepth(64, 64), rdma.WithMaxMessage(64))...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cb, err := c.Alloc(8)
	require.NoError(t, err)
	defer cb.Release()
	sb, err := s.Alloc(8)
	require.NoError(t, err)
	defer sb.Release()
	const n = 1000
	for range n { // a ping-pong: one message each way at a time
		for _, p := range [][2]*rdma.Conn{{c, s}, {s, c}} {
			r := p[1].Recv()
			buf := cb
			if p[0] == s {
				buf = sb
			}
			f := p[0].Send(buf)
			require.NoError(t, f.Wait(ctx))
			require.NoError(t, r.Wait(ctx))
			r.Buffer().Release()
			f.Release()
			r.Release()
		}
	}
	for _, x := range []*rdma.Conn{c, s} {
		st := rdma.SharedRecvStats(x)
		t.Logf("refills by event %d, by poll %d, by grant %d", st.Refills[rdma.RefillEvent], st.Refills[rdma.RefillPoll], st.Refills[rdma.RefillGrant])
		assert.Positive(t, st.Refills[rdma.RefillPoll], "refills after a poll")
		assert.LessOrEqual(t, st.Refills[rdma.RefillEvent], uint64(n/100), "refills by the limit event, with the check keeping up")
	}
}

// Rule: connections whose credits add up to more than the shared receive
// queue holds all get their messages through, in turn: back-pressure,
// never a receiver-not-ready retry, never more receives posted than
// WithSharedReceives, never a message delivered to the wrong connection.
func TestSRQContention(t *testing.T) { eachProvider(t, testSRQContention) }

func testSRQContention(t *testing.T, opts []rdma.Option) {
	const conns, n, depth = 8, 300, 16
	opts = append(opts, rdma.WithQueueDepth(16, 8), rdma.WithMaxMessage(1024))
	se, err := rdma.OpenEngine(append(engineOpts(opts), rdma.WithSharedReceives(depth))...)
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer ce.Close()
	clients, servers := enginePairs(t, ce, se, conns, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	maxPosted := int64(0)
	sample := func() {
		st := rdma.SharedRecvStats(servers[0])
		mu.Lock()
		maxPosted = max(maxPosted, st.Posted)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Go(func() { errs <- streamMessages(ctx, clients[i], servers[i], uint32(i), n, sample) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, maxPosted, int64(depth), "receives posted")
	st := rdma.SharedRecvStats(servers[0])
	t.Logf("%d connections, credits for %d, %d receives: most posted %d, refills %v", conns, conns*8, depth, maxPosted, st.Refills)
}

// Rule: when the pool limit stops the shared receive queue from growing
// (the application holds the received buffers), senders wait; once the
// application lets buffers go, every message arrives.
func TestSRQPoolLimit(t *testing.T) {
	opts := []rdma.Option{rdma.WithProvider(rdma.ProviderSoft), rdma.WithQueueDepth(64, 64), rdma.WithMaxMessage(64 << 10)}
	// One 4 MiB slab: 64 buffers of 64 KiB, all of which the receiver
	// ends up holding.
	se, err := rdma.OpenEngine(append(engineOpts(opts), rdma.WithPoolLimit(4<<20))...)
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer ce.Close()
	clients, servers := enginePairs(t, ce, se, 2, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 200
	var fs [2][]*rdma.Future
	for i, c := range clients {
		b, err := c.Alloc(1024)
		require.NoError(t, err)
		defer b.Release()
		for range n {
			fs[i] = append(fs[i], c.Send(b))
		}
	}
	// Hold every buffer received until the pool is spent, then let them
	// all go and take the rest.
	var mu sync.Mutex
	var held []*rdma.Buffer
	holding := true
	full, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() {
			for k := range n {
				r := s.Recv()
				if !assert.NoError(t, r.Wait(ctx), "connection %d, message %d", i, k) {
					return
				}
				mu.Lock()
				keep := holding
				if keep {
					held = append(held, r.Buffer())
				}
				spent := keep && len(held) >= 60
				mu.Unlock()
				if !keep {
					assert.NoError(t, r.Buffer().Release())
				}
				if spent {
					once.Do(func() { close(full) })
					<-resume
				}
			}
		})
	}
	select {
	case <-full:
	case <-ctx.Done():
		t.Fatal("the receiver never held 60 buffers")
	}
	short, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	assert.ErrorIs(t, fs[0][n-1].Wait(short), context.DeadlineExceeded, "the last send went out while the receiver held the pool")
	assert.ErrorIs(t, fs[1][n-1].Wait(short), context.DeadlineExceeded, "the last send went out while the receiver held the pool")
	stop()
	mu.Lock()
	for _, b := range held {
		require.NoError(t, b.Release())
	}
	held, holding = nil, false
	mu.Unlock()
	close(resume)
	wg.Wait()
	for i := range fs {
		for _, f := range fs[i] {
			require.NoError(t, f.Wait(ctx))
		}
	}
	assert.LessOrEqual(t, servers[0].PoolStats().BytesRegistered, int64(4<<20))
}

// Rule: a connection that has sent nothing for a while gives its credits
// back, so idle connections hold none of the shared receive queue; its
// next message asks for credits again.
func TestIdleCreditsReturn(t *testing.T) { eachProvider(t, testIdleCreditsReturn) }

func testIdleCreditsReturn(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithMaxMessage(1024))...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for round := range 2 {
		require.NoError(t, streamMessages(ctx, c, s, 7, 10, nil), "round %d", round)
		require.Positive(t, rdma.SharedRecvStats(s).Granted, "round %d: credits out while the peer sends", round)
		require.Eventually(t, func() bool { return rdma.SharedRecvStats(s).Granted == 0 }, 10*time.Second, 10*time.Millisecond,
			"round %d: the idle peer kept its credits", round)
	}
}

// Rule: a message sent without a credit cuts the peer off with
// ErrProtocol: a peer cannot take more of the shared receive queue than
// it was given.
func TestMessageWithoutCredit(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A first exchange gets receives posted for the peer.
	require.NoError(t, streamMessages(ctx, c, s, 1, 10, nil))
	rdma.ForgeCredits(c, 1000)
	b, err := c.Alloc(8)
	require.NoError(t, err)
	defer b.Release()
	for range 100 {
		c.Send(b)
	}
	// The messages that came with credits are still delivered; Done
	// closes once they are taken.
	for {
		r := s.Recv()
		if r.Wait(ctx) != nil {
			break
		}
		require.NoError(t, r.Buffer().Release())
	}
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("the receiver took a message without a credit")
	}
	require.ErrorIs(t, s.Err(), rdma.ErrProtocol)
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("the cut-off sender did not see its connection end")
	}
	require.True(t, errors.Is(c.Err(), rdma.ErrPeerClosed), "sender: %v", c.Err())
}

// enginePairs opens n connections from ce to a listener on se, closed
// when the test ends (unless the test closed them itself).
func enginePairs(t *testing.T, ce, se *rdma.Engine, n int, opts ...rdma.Option) (clients, servers []*rdma.Conn) {
	t.Helper()
	ln, err := se.Listen("rdma", "127.0.0.1:0", listenOpts(opts)...)
	require.NoError(t, err)
	defer ln.Close()
	dial := func(ctx context.Context, address string) (*rdma.Conn, error) {
		return ce.Dial(ctx, "rdma", address, connOpts(opts)...)
	}
	for range n {
		c, s := rdmatest.Connect(t, ln, dial)
		clients, servers = append(clients, c), append(servers, s)
	}
	return clients, servers
}

// Rule: registered memory follows the load down. Once a burst on many
// connections is over and they close, the engine gives its pool's idle
// memory back by itself within seconds, and at once on Trim. A server
// of 1,000 connections once kept 84 MiB registered after they all
// closed, with nothing in use.
func TestMemoryFollowsLoad(t *testing.T) {
	opts := []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)}
	se, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, se.Close()) }()
	ce, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	defer func() { assert.NoError(t, ce.Close()) }()
	clients, accepted := enginePairs(t, ce, se, 40, opts...)
	servers := peers(t, clients, accepted)
	burst(t, clients, servers, 100)
	t.Logf("after the burst: server pool %+v, SRQ %+v", se.PoolStats(), rdma.SharedRecvStats(servers[0]))
	for i := range clients {
		require.NoError(t, clients[i].Close())
		require.NoError(t, servers[i].Close())
	}
	for _, e := range []*rdma.Engine{se, ce} {
		require.Eventually(t, func() bool { return e.PoolStats().BuffersInUse == 0 }, 10*time.Second, time.Millisecond,
			"buffers in use after every connection closed: %+v", e.PoolStats())
	}
	t.Logf("closed: server pool %+v, client pool %+v", se.PoolStats(), ce.PoolStats())
	require.NoError(t, ce.Trim())
	assert.Zero(t, ce.PoolStats().BytesRegistered, "registered after Trim: %+v", ce.PoolStats())
	require.Eventually(t, func() bool { return se.PoolStats().BytesRegistered == 0 }, 10*time.Second, 10*time.Millisecond,
		"registered with nothing in use, no Trim: %+v", se.PoolStats())
	t.Logf("later: server pool %+v", se.PoolStats())
}

// Rule: a peer's abort reaches the sender as the peer's close, with its
// reason, even when the NAKs of the messages the peer refused reach the
// sender's poller before the abort frame reaches its control reader (here
// the reader is held until they have): the failed completions wait for
// the control channel's word. Without it they said ErrPeerLost in up to
// 4 runs in 10 of TestMessageWithoutCredit.
func TestAbortBeatsItsNAKs(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, streamMessages(ctx, c, s, 1, 10, nil))
	release := rdma.SlowControl(c)
	defer release()
	rdma.ForgeCredits(c, 1000)
	b, err := c.Alloc(8)
	require.NoError(t, err)
	defer b.Release()
	var sends []*rdma.Future
	for range 100 {
		sends = append(sends, c.Send(b))
	}
	// The peer cuts this side off at the first message without a
	// credit; the messages after that find its queue pair failed.
	require.Eventually(t, func() bool { return errors.Is(s.Err(), rdma.ErrProtocol) }, 20*time.Second, time.Millisecond)
	for range 10 {
		sends = append(sends, c.Send(b))
	}
	require.Eventually(t, func() bool { return rdma.AwaitsVerdict(c) }, 20*time.Second, time.Millisecond,
		"no completion said the peer's queue pair failed")
	release()
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("the cut-off sender did not see its connection end")
	}
	require.ErrorIs(t, c.Err(), rdma.ErrPeerClosed, "sender: %v", c.Err())
	assert.NotErrorIs(t, c.Err(), rdma.ErrPeerLost)
	assert.Contains(t, c.Err().Error(), "without a credit", "the peer's reason")
	for i, f := range sends {
		if err := f.Wait(ctx); err != nil {
			assert.ErrorIs(t, err, rdma.ErrPeerClosed, "send %d", i)
		}
	}
}
