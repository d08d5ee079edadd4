package rc

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The send queue alone: a fake QP that records the chains posted to it
// and fails a post when told to, a fake owner, no device, no peer and no
// poller. Each case runs in microseconds.

// fakePoster is a verbs.QP whose PostSend records chains; accept, when
// not negative, is how many WRs of the next post it takes before it
// fails.
type fakePoster struct {
	verbs.QP // the rest of the interface: not called by the send queue
	chains   [][]verbs.SendWR
	accept   int
	// read, when set, reads the memory an SGE names: inline keeps the
	// bytes of each inline WR taken, copied at the post as a device does
	read   func(verbs.SGE) string
	inline []string
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
	for _, wr := range wrs[:n] {
		if p.read != nil && wr.Flags&verbs.SendInline != 0 && len(wr.SGL) > 0 {
			p.inline = append(p.inline, p.read(wr.SGL[0]))
		}
	}
	return n, err
}

// wrs is every WR posted, chain by chain.
func (p *fakePoster) wrs() []verbs.SendWR {
	var all []verbs.SendWR
	for _, c := range p.chains {
		all = append(all, c...)
	}
	return all
}

// fakeFuture records its resolution, as rdma's Future does: the first
// counts.
type fakeFuture struct {
	mu       sync.Mutex
	resolved bool
	err      error
}

func (f *fakeFuture) ResolveOp(gen uint32, err error, n int, old uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.resolved {
		f.resolved, f.err = true, err
	}
}

func (f *fakeFuture) Resolved() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.resolved }
func (f *fakeFuture) Err() error     { f.mu.Lock(); defer f.mu.Unlock(); return f.err }

// fakeOwner is the connection as the send queue sees it: it finishes
// ops as the completion path does, and records failures and jobs.
type fakeOwner struct {
	life   *Life
	failed []error
	jobs   int
}

func (o *fakeOwner) Fail(err error)                            { o.failed = append(o.failed, err) }
func (o *fakeOwner) Later(func())                              { o.jobs++ }
func (o *fakeOwner) CutOff(err error)                          { o.failed = append(o.failed, err) }
func (o *fakeOwner) ProtocolErr(string, ...any)                {}
func (o *fakeOwner) WriteControl(byte, []byte) error           { return nil }
func (o *fakeOwner) FailedRecv(wc *verbs.WorkCompletion) error { return errPost }
func (o *fakeOwner) RecvErr(wc *verbs.WorkCompletion) error    { return errPost }
func (o *fakeOwner) Dispatch()                                 {}
func (o *fakeOwner) Finish(op *Op, err error) {
	if op.Signaled || op.Covered || err != nil {
		op.Resolve(err, op.N, 0)
	}
	if op.Buf != nil {
		op.DropBuf()
	}
	o.life.OpDone()
}

// sendQueue is a send queue of depth depth holding credits, over a fake
// QP, with the parts it works with.
type sendQueue struct {
	SendQueue
	ops   OpTable
	life  Life
	cw    CreditWord
	peer  Hello
	owner fakeOwner
}

func newSendQueue(t *testing.T, depth, credits int) (*sendQueue, *fakePoster) {
	t.Helper()
	p := &fakePoster{accept: -1}
	q := &sendQueue{}
	q.peer.MaxMsg = 1 << 20
	q.life.Init(nil)
	q.owner.life = &q.life
	q.SendQueue.Init(depth, DefaultLimit(depth), &q.ops, &q.life, &q.cw, &q.peer, true, &q.owner)
	q.SetQP(p, 0, nil, nil)
	q.credits = credits
	return q, p
}

// sendOpOf is a message of no bytes with a Future.
func sendOpOf(opc verbs.Opcode) (verbs.SendWR, Op, *fakeFuture) {
	f := &fakeFuture{}
	kind := OpSend
	if opc == verbs.OpWrite {
		kind = OpWrite
	}
	return verbs.SendWR{Opcode: opc, Flags: verbs.SendSignaled}, Op{Kind: kind, Fut: f, Signaled: true}, f
}

// issue submits one operation as Conn.post does, and returns its Future.
func issue(q *sendQueue, opc verbs.Opcode) *fakeFuture {
	wr, o, f := sendOpOf(opc)
	q.Submit(&wr, verbs.SGE{}, &o)
	return f
}

// completeWR completes the posted WR id successfully, as the completion
// path does (onSendDone): it resolves it and the unsignaled WRs before
// it, and gives their room back.
func completeWR(q *sendQueue, id uint64) {
	o, ok := q.ops.Take(id)
	k := q.TakeCovered(id)
	if ok {
		q.owner.Finish(&o, nil)
	}
	q.Settle(k)
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
			q, p := newSendQueue(t, tc.depth, tc.credits)
			for _, opc := range tc.ops {
				issue(q, opc)
			}
			assert.Len(t, p.wrs(), tc.posted, "WRs posted")
			assert.Equal(t, tc.waiting, q.pending.Len(), "chains waiting")
			assert.Equal(t, tc.depth-tc.posted, q.sqFree, "room left")
			assert.Equal(t, tc.creditWaits, q.st.creditWaits.Load())
			assert.Equal(t, tc.queueWaits, q.st.queueWaits.Load())
			assert.Equal(t, uint64(tc.posted), q.posted)
			assert.Equal(t, tc.posted, q.sent.len(), "the sent ring holds every posted WR")
		})
	}
}

// Completions give room back and post what waited, oldest first; credits
// given post the messages that waited for them.
func TestSendQueueDrain(t *testing.T) {
	q, p := newSendQueue(t, 2, 8)
	for range 5 {
		issue(q, verbs.OpSend)
	}
	require.Len(t, p.wrs(), 2)
	require.Equal(t, 3, q.pending.Len())
	completeWR(q, p.wrs()[0].ID)
	assert.Len(t, p.wrs(), 3)
	completeWR(q, p.wrs()[2].ID) // covers the second too
	assert.Len(t, p.wrs(), 5)
	assert.Zero(t, q.pending.Len())
	assert.Equal(t, uint64(3), q.completed.Load())
	assert.Equal(t, int64(2), q.life.Inflight())

	q, p = newSendQueue(t, 8, 0)
	issue(q, verbs.OpSend)
	issue(q, verbs.OpWrite)
	issue(q, verbs.OpSend)
	require.Empty(t, p.wrs())
	q.postMu.Lock()
	q.addCreditsLocked(1)
	q.drainLocked()
	q.unlockPost()
	assert.Len(t, p.wrs(), 2, "the first message and the WRITE behind it")
	q.postMu.Lock()
	q.addCreditsLocked(1)
	q.drainLocked()
	q.idleTimer.Stop()
	q.unlockPost()
	assert.Len(t, p.wrs(), 3)
	assert.Zero(t, q.credits)
}

// Operations left by goroutines that found postMu taken go out as one
// chain when its holder lets go, signaled every signalEvery WRs and at
// its end; a completion of a signaled WR resolves the unsignaled ones
// before it.
func TestSendQueueCombining(t *testing.T) {
	const n = 40
	q, p := newSendQueue(t, 64, 64)
	q.postMu.Lock()
	fs := make([]*fakeFuture, n)
	for i := range fs {
		fs[i] = issue(q, verbs.OpWrite) // postMu is taken: left in the combining queue
	}
	require.Empty(t, p.chains)
	q.postUnlock()
	require.Len(t, p.chains, 1, "one chain, one doorbell")
	chain := p.chains[0]
	require.Len(t, chain, n)
	for i, wr := range chain {
		want := i == n-1 || (i+1)%signalEvery == 0
		assert.Equal(t, want, wr.Flags&verbs.SendSignaled != 0, "WR %d signaled", i)
	}
	// The completion of the second signaled WR covers the first 32.
	k := q.TakeCovered(chain[2*signalEvery-1].ID)
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
	q, p := newSendQueue(t, 4, 4)
	p.accept = 0
	f := issue(q, verbs.OpSend)
	require.True(t, f.Resolved())
	require.ErrorIs(t, f.Err(), errPost)
	assert.Equal(t, 4, q.sqFree)
	assert.Equal(t, 4, q.credits)
	assert.Zero(t, q.sent.len())
	assert.Zero(t, q.posted)
	assert.Empty(t, q.ops.IDs())
	assert.Zero(t, q.life.Inflight())

	q, p = newSendQueue(t, 8, 8)
	wrs := make([]verbs.SendWR, 4)
	ops := make([]Op, 4)
	for i := range wrs {
		wrs[i], ops[i], _ = sendOpOf(verbs.OpSend)
	}
	p.accept = 2
	q.postMu.Lock()
	err := q.postLocked(wrs, ops)
	require.ErrorIs(t, err, errPost)
	assert.Equal(t, 6, q.sqFree, "the two WRs taken keep their room")
	assert.Equal(t, 6, q.credits)
	assert.Equal(t, 2, q.sent.len())
	assert.Equal(t, uint64(2), q.posted)
	assert.Len(t, q.ops.IDs(), 2)
	assert.Error(t, q.failAfter, "the connection fails at unlock")
	q.failAfter = nil
	q.postMu.Unlock()
}

// The credit WRITE waits for no one: with postMu taken it is left to the
// holder, who posts it as it lets go, in the room beyond the send depth.
func TestSendQueueCreditWrite(t *testing.T) {
	q, p := newSendQueue(t, 1, 1)
	q.cw.buf.Mem = make([]byte, 16)
	q.cw.mr = fakeMR{}
	q.peer.CreditRKey, q.peer.CreditAddr = 7, 0x1000
	q.cw.total.Store(5)
	issue(q, verbs.OpSend) // the send depth is used up
	q.postMu.Lock()
	q.PostCredit()
	require.Len(t, p.chains, 1, "left to postMu's holder")
	q.unlockPost()
	require.Len(t, p.chains, 2)
	wr := p.chains[1][0]
	assert.Equal(t, verbs.OpWrite, wr.Opcode)
	assert.Equal(t, uint32(7), wr.RKey)
	assert.Equal(t, uint32(5), q.cw.written.Load())
	assert.Zero(t, q.sqFree, "it takes no room of the send depth")
	assert.Equal(t, 1, q.sent.len(), "nor a place in the sent ring")
	assert.Equal(t, uint64(1), q.posted)
}

// fakeMR stands for the credit word's registration.
type fakeMR struct{ verbs.MR }

// Held sends (a listener on iWARP waits for its dialer's go) queue in
// order, those left in the combining queue too, and go out when
// released.
func TestSendQueueHeld(t *testing.T) {
	q, p := newSendQueue(t, 8, 8)
	q.Hold()
	issue(q, verbs.OpSend)
	q.postMu.Lock()
	issue(q, verbs.OpWrite) // left in the combining queue
	q.postUnlock()
	issue(q, verbs.OpSend)
	require.Empty(t, p.chains, "nothing goes out while held")
	require.Equal(t, 3, q.pending.Len())
	q.Release()
	ops := []verbs.Opcode{}
	for _, wr := range p.wrs() {
		ops = append(ops, wr.Opcode)
	}
	assert.Equal(t, []verbs.Opcode{verbs.OpSend, verbs.OpWrite, verbs.OpSend}, ops, "in the order issued")
	assert.Zero(t, q.pending.Len())
}

// TestLatencySampleEvery: stampLatency marks exactly every
// LatencySample-th op, across calls and batches.
func TestLatencySampleEvery(t *testing.T) {
	var q SendQueue
	ops := make([]Op, 3*LatencySample+5)
	for i := 0; i < len(ops); i += 7 {
		q.stampLatency(ops[i:min(i+7, len(ops))])
	}
	for i := range ops {
		assert.Equal(t, (i+1)%LatencySample == 0, ops[i].Start != 0, "op %d", i)
	}
}
