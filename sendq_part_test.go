package rdma

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The send queue alone: a connection with a fake QP that records the
// chains posted to it and fails a post when told to, no device, no peer
// and no poller. Each case runs in microseconds.

// fakePoster is a verbs.QP whose PostSend records chains; accept, when
// not negative, is how many WRs of the next post it takes before it
// fails.
type fakePoster struct {
	verbs.QP // the rest of the interface: not called by the send queue
	chains   [][]verbs.SendWR
	accept   int
}

var errPost = errors.New("fake post failure")

func (p *fakePoster) PostSend(wrs []verbs.SendWR) (int, error) {
	n := len(wrs)
	var err error
	if p.accept >= 0 {
		n, err = min(n, p.accept), errPost
		p.accept = -1
	}
	p.chains = append(p.chains, append([]verbs.SendWR(nil), wrs[:n]...))
	return n, err
}

// opcodes is the opcode of every WR posted, chain by chain.
func (p *fakePoster) wrs() []verbs.SendWR {
	var all []verbs.SendWR
	for _, c := range p.chains {
		all = append(all, c...)
	}
	return all
}

// sendQueueConn is a connection of send depth depth holding credits,
// over a fake QP: what the send queue touches and nothing more.
func sendQueueConn(t *testing.T, depth, credits int) (*conn, *fakePoster) {
	t.Helper()
	p := &fakePoster{accept: -1}
	c := &conn{eng: &engine{cfg: config{pollMode: PollEvent}}, cfg: config{sqDepth: depth}, qp: p}
	c.peer.MaxMsg = 1 << 20
	c.life.Init(nil)
	c.sq.init(depth, func() {}, func() {})
	c.sq.credits = credits
	return c, p
}

// sendOpOf is a message of no bytes with a Future.
func sendOpOf(c *conn, opc verbs.Opcode) (verbs.SendWR, rc.Op) {
	f := newFuture(nil)
	kind := rc.OpSend
	if opc == verbs.OpWrite {
		kind = rc.OpWrite
	}
	return verbs.SendWR{Opcode: opc, Flags: verbs.SendSignaled}, rc.Op{Kind: kind, Fut: (*opFuture)(f), Gen: f.gen, Signaled: true}
}

// issue submits one operation as Conn.post does, and returns its Future.
func issue(c *conn, opc verbs.Opcode) *Future {
	wr, o := sendOpOf(c, opc)
	c.submit(wr, verbs.SGE{}, o)
	return (*Future)(o.Fut.(*opFuture))
}

// completeWR completes the posted WR id successfully, as the completion
// path does (onSendDone): it resolves it and the unsignaled WRs before
// it, and gives their room back.
func completeWR(c *conn, id uint64) {
	o, ok := c.ops.Take(id)
	k := c.takeCovered(id)
	if ok {
		c.finish(&o, nil)
	}
	c.settle(k)
}

func TestSendQueueRoom(t *testing.T) {
	for _, tc := range []struct {
		name            string
		depth, credits  int
		ops             []verbs.Opcode
		posted, waiting int // WRs posted and chains waiting after the ops
		creditWaits     uint64
		queueWaits      uint64
	}{
		{"fits", 4, 8, []verbs.Opcode{verbs.OpSend, verbs.OpSend, verbs.OpWrite}, 3, 0, 0, 0},
		{"room short", 2, 8, []verbs.Opcode{verbs.OpSend, verbs.OpSend, verbs.OpSend, verbs.OpWrite}, 2, 2, 0, 2},
		{"credits short", 8, 1, []verbs.Opcode{verbs.OpSend, verbs.OpSend}, 1, 1, 1, 0},
		// A WRITE takes no credit, but goes in order behind a message
		// that waits for one.
		{"in order behind a credit wait", 8, 0, []verbs.Opcode{verbs.OpSend, verbs.OpWrite}, 0, 2, 2, 0},
		{"immediate data takes a credit", 8, 1, []verbs.Opcode{verbs.OpWriteWithImm, verbs.OpSendWithImm}, 1, 1, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, p := sendQueueConn(t, tc.depth, tc.credits)
			for _, opc := range tc.ops {
				issue(c, opc)
			}
			assert.Len(t, p.wrs(), tc.posted, "WRs posted")
			assert.Equal(t, tc.waiting, c.sq.pending.Len(), "chains waiting")
			assert.Equal(t, tc.depth-tc.posted, c.sq.sqFree, "room left")
			assert.Equal(t, tc.creditWaits, c.st.creditWaits.Load())
			assert.Equal(t, tc.queueWaits, c.st.queueWaits.Load())
			assert.Equal(t, uint64(tc.posted), c.sq.posted)
			assert.Equal(t, tc.posted, c.sq.sent.len(), "the sent ring holds every posted WR")
		})
	}
}

// Completions give room back and post what waited, oldest first; credits
// given post the messages that waited for them.
func TestSendQueueDrain(t *testing.T) {
	c, p := sendQueueConn(t, 2, 8)
	for range 5 {
		issue(c, verbs.OpSend)
	}
	require.Len(t, p.wrs(), 2)
	require.Equal(t, 3, c.sq.pending.Len())
	completeWR(c, p.wrs()[0].ID)
	assert.Len(t, p.wrs(), 3)
	completeWR(c, p.wrs()[2].ID) // covers the second too
	assert.Len(t, p.wrs(), 5)
	assert.Zero(t, c.sq.pending.Len())
	assert.Equal(t, uint64(3), c.sq.completed.Load())
	assert.Equal(t, int64(2), c.life.Inflight())

	c, p = sendQueueConn(t, 8, 0)
	issue(c, verbs.OpSend)
	issue(c, verbs.OpWrite)
	issue(c, verbs.OpSend)
	require.Empty(t, p.wrs())
	c.sq.postMu.Lock()
	c.addCreditsLocked(1)
	c.drainLocked()
	c.unlockPost()
	assert.Len(t, p.wrs(), 2, "the first message and the WRITE behind it")
	c.sq.postMu.Lock()
	c.addCreditsLocked(1)
	c.drainLocked()
	c.sq.idleTimer.Stop()
	c.unlockPost()
	assert.Len(t, p.wrs(), 3)
	assert.Zero(t, c.sq.credits)
}

// Operations left by goroutines that found postMu taken go out as one
// chain when its holder lets go, signaled every signalEvery WRs and at
// its end; a completion of a signaled WR resolves the unsignaled ones
// before it.
func TestSendQueueCombining(t *testing.T) {
	const n = 40
	c, p := sendQueueConn(t, 64, 64)
	c.sq.postMu.Lock()
	fs := make([]*Future, n)
	for i := range fs {
		fs[i] = issue(c, verbs.OpWrite) // postMu is taken: left in the combining queue
	}
	require.Empty(t, p.chains)
	c.postUnlock()
	require.Len(t, p.chains, 1, "one chain, one doorbell")
	chain := p.chains[0]
	require.Len(t, chain, n)
	for i, wr := range chain {
		want := i == n-1 || (i+1)%signalEvery == 0
		assert.Equal(t, want, wr.Flags&verbs.SendSignaled != 0, "WR %d signaled", i)
	}
	// The completion of the second signaled WR covers the first 32.
	k := c.takeCovered(chain[2*signalEvery-1].ID)
	assert.Equal(t, 2*signalEvery, k)
	for i, f := range fs[:2*signalEvery-1] {
		assert.True(t, f.Resolved(), "future %d resolved by the completion that covers it", i)
	}
	assert.False(t, fs[2*signalEvery].Resolved())
}

// A post the provider refuses leaves nothing recorded: room, credits,
// the op table and the sent ring are as before, and the Future fails.
// A chain the provider took in part keeps what it took, and fails the
// connection at unlock (so that the QP's flush reports those WRs).
func TestSendQueueUndo(t *testing.T) {
	c, p := sendQueueConn(t, 4, 4)
	p.accept = 0
	f := issue(c, verbs.OpSend)
	require.True(t, f.Resolved())
	require.ErrorIs(t, f.Err(), errPost)
	assert.Equal(t, 4, c.sq.sqFree)
	assert.Equal(t, 4, c.sq.credits)
	assert.Zero(t, c.sq.sent.len())
	assert.Zero(t, c.sq.posted)
	assert.Empty(t, c.ops.IDs())
	assert.Zero(t, c.life.Inflight())

	c, p = sendQueueConn(t, 8, 8)
	wrs := make([]verbs.SendWR, 4)
	ops := make([]rc.Op, 4)
	for i := range wrs {
		wrs[i], ops[i] = sendOpOf(c, verbs.OpSend)
	}
	p.accept = 2
	c.sq.postMu.Lock()
	err := c.postLocked(wrs, ops)
	require.ErrorIs(t, err, errPost)
	assert.Equal(t, 6, c.sq.sqFree, "the two WRs taken keep their room")
	assert.Equal(t, 6, c.sq.credits)
	assert.Equal(t, 2, c.sq.sent.len())
	assert.Equal(t, uint64(2), c.sq.posted)
	assert.Len(t, c.ops.IDs(), 2)
	assert.Error(t, c.sq.failAfter, "the connection fails at unlock")
	c.sq.failAfter = nil
	c.sq.postMu.Unlock()
}

// The credit WRITE waits for no one: with postMu taken it is left to the
// holder, who posts it as it lets go, in the room beyond the send depth.
func TestSendQueueCreditWrite(t *testing.T) {
	c, p := sendQueueConn(t, 1, 1)
	c.cr.cw.buf.Mem = make([]byte, 16)
	c.cr.cw.mr = fakeMR{}
	c.peer.CreditRKey, c.peer.CreditAddr = 7, 0x1000
	c.cr.cw.total.Store(5)
	issue(c, verbs.OpSend) // the send depth is used up
	c.sq.postMu.Lock()
	c.postCredit()
	require.Len(t, p.chains, 1, "left to postMu's holder")
	c.unlockPost()
	require.Len(t, p.chains, 2)
	wr := p.chains[1][0]
	assert.Equal(t, verbs.OpWrite, wr.Opcode)
	assert.Equal(t, uint32(7), wr.RKey)
	assert.Equal(t, uint32(5), c.cr.cw.written.Load())
	assert.Zero(t, c.sq.sqFree, "it takes no room of the send depth")
	assert.Equal(t, 1, c.sq.sent.len(), "nor a place in the sent ring")
	assert.Equal(t, uint64(1), c.sq.posted)
}

// fakeMR stands for the credit word's registration.
type fakeMR struct{ verbs.MR }

// Held sends (a listener on iWARP waits for its dialer's go) queue in
// order, those left in the combining queue too, and go out when
// released.
func TestSendQueueHeld(t *testing.T) {
	c, p := sendQueueConn(t, 8, 8)
	c.holdSends()
	issue(c, verbs.OpSend)
	c.sq.postMu.Lock()
	issue(c, verbs.OpWrite) // left in the combining queue
	c.postUnlock()
	issue(c, verbs.OpSend)
	require.Empty(t, p.chains, "nothing goes out while held")
	require.Equal(t, 3, c.sq.pending.Len())
	c.releaseSends()
	ops := []verbs.Opcode{}
	for _, wr := range p.wrs() {
		ops = append(ops, wr.Opcode)
	}
	assert.Equal(t, []verbs.Opcode{verbs.OpSend, verbs.OpWrite, verbs.OpSend}, ops, "in the order issued")
	assert.Zero(t, c.sq.pending.Len())
}
