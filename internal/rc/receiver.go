package rc

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/fifo"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Receiver is a connection's receive side: rmu and the state it guards,
// the messages that arrived and the Recvs that wait for them, the
// receives it posts itself (rdma_cm connections; the others receive
// through a shared receive queue), and the end of delivery (Done).
type Receiver struct {
	rmu       sync.Mutex
	rposted   int // receives posted (without an SRQ)
	ready     fifo.Queue[Message]
	waiters   fifo.Queue[Delivery]
	rwrs      []verbs.RecvWR
	rsges     []verbs.SGE
	handling  bool // a worker runs the RecvHandler
	ended     bool // done is closed
	abandoned bool // the receives left will never complete (Abandon)

	beaconDone atomic.Bool // the beacon flushed: every message that came is delivered
	awaitingGo atomic.Bool // a listener on iWARP: its first receive is the dialer's go (AwaitGo)
	goBound    *time.Timer // fails the connection if the go does not come
	recvs      atomic.Uint64
	recvBytes  atomic.Uint64

	// The parts it works with, set by Init and SetQP, read-only after.
	size    int  // the bytes a receive takes (WithMaxMessage)
	shared  bool // messages come through a shared receive queue
	handled bool // messages go to a RecvHandler, not to Recv
	done    chan struct{}
	life    *Life
	ops     *OpTable
	grants  *Grants
	sq      *SendQueue
	owner   Owner
	pool    *pool.Pool
	qp      verbs.QP
	poller  *poller.Poller // the CQ's: once it stopped, nothing more comes
}

// Delivery is a Recv's Future as the receive side sees it (rdma's).
type Delivery interface {
	// Deliver resolves the Recv with a message (pb is nil for a
	// WRITE_WITH_IMM's notice) or with err, and reports false when it
	// had resolved already.
	Deliver(err error, n int, imm uint32, has bool, pb *pool.Buffer) bool
}

// Message is a received message: Buf holds its N bytes (nil for a
// WRITE_WITH_IMM's notice), Imm its immediate value when Has.
type Message struct {
	Buf *pool.Buffer
	N   int
	Imm uint32
	Has bool
}

// Init makes the receive side of a connection whose receives take size
// bytes: shared says they come through a shared receive queue, handled
// that a RecvHandler takes them; done is the connection's Done, closed
// once it ended and every message that arrived was handed over.
func (r *Receiver) Init(size int, shared, handled bool, done chan struct{}, life *Life, ops *OpTable, grants *Grants, sq *SendQueue, owner Owner, pool *pool.Pool) {
	r.size, r.shared, r.handled, r.done = size, shared, handled, done
	r.life, r.ops, r.grants, r.sq, r.owner, r.pool = life, ops, grants, sq, owner, pool
}

// SetQP gives the receive side its QP, and the poller of its CQ; a
// connection that posts its own receives makes room for depth of them.
func (r *Receiver) SetQP(qp verbs.QP, p *poller.Poller, depth int) {
	r.qp, r.poller = qp, p
	if r.shared {
		return
	}
	r.rwrs = make([]verbs.RecvWR, depth)
	r.rsges = make([]verbs.SGE, depth)
	for i := range r.rwrs {
		r.rwrs[i].SGL = r.rsges[i : i+1]
	}
}

// Mutex is rmu, for the grants, which count takes under it.
func (r *Receiver) Mutex() *sync.Mutex { return &r.rmu }

// RecvCounter is the count of messages received, which the grants' decay
// look reads.
func (r *Receiver) RecvCounter() *atomic.Uint64 { return &r.recvs }

// Counts reads the messages received and their bytes.
func (r *Receiver) Counts() (msgs, bytes uint64) { return r.recvs.Load(), r.recvBytes.Load() }

// PostReceives fills the receive queue of a connection without an SRQ;
// the QP must be in INIT.
func (r *Receiver) PostReceives() error {
	if r.shared {
		return nil
	}
	r.rmu.Lock()
	defer r.rmu.Unlock()
	return r.repostLocked(len(r.rwrs))
}

// EndIfDelivered closes Done once the connection has ended and every
// message that arrived was handed over.
func (r *Receiver) EndIfDelivered() {
	r.rmu.Lock()
	r.endIfDeliveredLocked()
	r.rmu.Unlock()
}

// endIfDeliveredLocked closes Done once the connection has ended and
// every message that arrived was handed over: taken by Recv, or handled
// (the handler returned). Caller holds rmu.
func (r *Receiver) endIfDeliveredLocked() {
	if r.ended || r.life.Err() == nil || r.ready.Len() > 0 || r.handling || r.moreToComeLocked() {
		return
	}
	r.ended = true
	close(r.done)
}

// OnRecv delivers a completion of a receive the connection posted on its
// own receive queue. It runs on a poller.
func (r *Receiver) OnRecv(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	defer r.life.OpDone()
	r.rmu.Lock()
	r.rposted--
	if r.awaitingGo.Load() {
		if taken, err := r.takeGoLocked(pb, wc); taken {
			r.rmu.Unlock()
			if err != nil {
				r.owner.Fail(err)
			} else {
				r.sq.Release()
			}
			return
		}
	}
	r.deliverLocked(pb, wc)
}

// OnSharedRecv delivers a completion of a receive of the SRQ that a
// message to this connection took. It runs on a poller.
func (r *Receiver) OnSharedRecv(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	if wc.Status == verbs.WCSuccess && !r.grants.Arrived() {
		pb.Release()
		return
	}
	r.rmu.Lock()
	r.deliverLocked(pb, wc)
}

// DeliverLocked is deliverLocked for a test that plays the poller.
func (r *Receiver) DeliverLocked(pb *pool.Buffer, wc *verbs.WorkCompletion) { r.deliverLocked(pb, wc) }

// deliverLocked hands a received message to the oldest waiting Recv,
// the handler or the ready queue, or fails the connection when the
// receive failed. Caller holds rmu; it unlocks it.
func (r *Receiver) deliverLocked(pb *pool.Buffer, wc *verbs.WorkCompletion) {
	if r.ended {
		// Close took what was here, and nothing is delivered after it: a
		// completion the poller took as the QP went is dropped.
		r.rmu.Unlock()
		pb.Release()
		return
	}
	if wc.Status != verbs.WCSuccess {
		// Every receive before this one was delivered; the waiters
		// left will get nothing more.
		ws := r.waiters.Take()
		r.endIfDeliveredLocked()
		r.rmu.Unlock()
		pb.Release()
		err := r.owner.FailedRecv(wc)
		r.owner.Fail(err)
		for _, w := range ws {
			w.Deliver(err, 0, 0, false, nil)
		}
		return
	}
	m := Message{Buf: pb, N: int(wc.ByteLen), Imm: wc.Imm, Has: wc.Flags&verbs.WCWithImm != 0}
	r.recvs.Add(1)
	r.recvBytes.Add(uint64(m.N))
	if wc.Opcode == verbs.WCRecvWriteWithImm {
		// The data went to the written region; the buffer stayed empty,
		// so its next user need not clear it (a 64 KiB memclr per
		// notification otherwise).
		pb.Filled(0)
		pb.Release()
		m.Buf = nil
	} else {
		pb.Filled(m.N)
	}
	if r.waiters.Len() > 0 {
		w := r.waiters.Pop()
		r.refillLocked()
		r.endIfDeliveredLocked()
		r.rmu.Unlock()
		if !w.Deliver(nil, m.N, m.Imm, m.Has, m.Buf) && m.Buf != nil {
			m.Buf.Release() // resolved already: nobody would release it
		}
		return
	}
	r.ready.Push(m)
	if r.handled && !r.handling {
		r.handling = true
		r.owner.Dispatch()
	}
	r.rmu.Unlock()
}

// Recv takes the oldest message that arrived, or queues w for the next
// one. ok says a message was taken; err that none will come.
func (r *Receiver) Recv(w Delivery) (m Message, ok bool, err error) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.ready.Len() > 0 {
		return r.takeReadyLocked(), true, nil
	}
	if r.life.Err() != nil && !r.moreToComeLocked() {
		return Message{}, false, r.life.ClosedErr()
	}
	r.waiters.Push(w)
	return Message{}, false, nil
}

// NextHandled takes the next message for the RecvHandler; ok is false
// when none is left (or the connection closes), and the handler's run
// ends.
func (r *Receiver) NextHandled() (m Message, ok bool) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.ready.Len() == 0 || r.life.Closing() {
		r.handling = false
		r.endIfDeliveredLocked() // the handler returned for the last one
		return Message{}, false
	}
	return r.takeReadyLocked(), true
}

// takeReadyLocked takes the oldest message that arrived before a Recv
// asked for it. Caller holds rmu.
func (r *Receiver) takeReadyLocked() Message {
	m := r.ready.Pop()
	r.refillLocked()
	r.endIfDeliveredLocked()
	return m
}

// Withdraw removes the pending Recv w, if no message matched it yet, and
// resolves it as cancelled.
func (r *Receiver) Withdraw(w Delivery) bool {
	r.rmu.Lock()
	i := slices.Index(r.waiters.Items(), w)
	if i >= 0 {
		r.waiters.Remove(i)
	}
	r.rmu.Unlock()
	if i < 0 {
		return false
	}
	w.Deliver(fmt.Errorf("rdma: recv on %v withdrawn: %w", r.life.remote, context.Canceled), 0, 0, false, nil)
	return true
}

// moreToComeLocked reports whether messages of a failed connection may
// still be delivered. A failure can be seen (the peer's close on the
// control channel) before the poller has taken the completions of
// messages that arrived ahead of it. With its own receive queue, the QP
// completes the posted receives in order, first those that got a
// message before the failure, then flushes, which fail the waiters left
// (OnRecv). With an SRQ, the beacon's flush comes after every message
// that arrived (the connection posts it as it fails). After a local
// Close, or once the poller has stopped, or the receives left were
// abandoned (Abandon), nothing more comes. Caller holds rmu.
func (r *Receiver) moreToComeLocked() bool {
	if r.life.Closing() || r.abandoned || r.poller == nil || isClosed(r.poller.Done()) {
		return false
	}
	if r.shared {
		return !r.beaconDone.Load()
	}
	return r.rposted > 0
}

// Failed fails the Recvs waiting with err when nothing more can come
// for them (else the flushes or the beacon do), and closes Done when
// every message was handed over. The connection failed.
func (r *Receiver) Failed(err error) {
	r.rmu.Lock()
	var ws []Delivery
	if !r.moreToComeLocked() {
		ws = r.waiters.Take()
	}
	r.endIfDeliveredLocked()
	r.rmu.Unlock()
	for _, w := range ws {
		w.Deliver(err, 0, 0, false, nil)
	}
}

// OnBeacon fails the Recvs left: every message that came is delivered.
// Their error is the beacon's flush, as a receive's own flush would be;
// wc is nil when no beacon could be posted.
func (r *Receiver) OnBeacon(wc *verbs.WorkCompletion) {
	r.beaconDone.Store(true)
	r.rmu.Lock()
	ws := r.waiters.Take()
	r.endIfDeliveredLocked()
	r.rmu.Unlock()
	err := r.life.Err()
	if wc != nil && wc.Status != verbs.WCSuccess {
		err = r.owner.RecvErr(wc) // the Recvs' error: it names RECV; no receive failed
	}
	for _, w := range ws {
		w.Deliver(err, 0, 0, false, nil)
	}
}

// refillLocked accounts for a message the application took. With an SRQ
// its credit goes back to the peer (Grants.TookLocked). Otherwise it
// re-posts consumed receives once enough of them add up to a batch: one
// chain and one doorbell for many, as the peer libraries that kept
// receives deep learned. Caller holds rmu.
func (r *Receiver) refillLocked() {
	if r.shared {
		r.grants.TookLocked()
		return
	}
	if gap := len(r.rwrs) - r.rposted - r.ready.Len(); gap >= ReturnBatch(len(r.rwrs)) {
		before := r.rposted
		r.repostLocked(gap)
		r.grants.Owe(r.rposted - before)
	}
}

// repostLocked posts up to k receives, keeping at most the receive depth
// posted or waiting in ready. Caller holds rmu.
func (r *Receiver) repostLocked(k int) error {
	if r.life.Closing() || r.life.Err() != nil {
		return nil
	}
	k = min(k, len(r.rwrs)-r.rposted-r.ready.Len())
	if k <= 0 {
		return nil
	}
	for i := 0; i < k; i++ {
		pb, err := r.pool.GetReceive(r.size)
		if err != nil {
			r.unpost(i)
			return fmt.Errorf("rdma: receive buffers: %w", err)
		}
		r.rsges[i] = verbs.SGE{Addr: pb.Addr(), Length: uint32(r.size), LKey: pb.LKey()}
		r.life.AddInflight()
		r.rwrs[i].ID = r.ops.Add(Op{Kind: OpRecv, Buf: pb})
	}
	n, err := r.qp.PostRecv(r.rwrs[:k])
	r.rposted += n
	if err != nil {
		for i := n; i < k; i++ {
			if o, ok := r.ops.Take(r.rwrs[i].ID); ok {
				o.Buf.Release()
				r.life.OpDone()
			}
		}
		return fmt.Errorf("rdma: post receives: %w", err)
	}
	return nil
}

// unpost undoes the first i prepared receives.
func (r *Receiver) unpost(i int) {
	for j := 0; j < i; j++ {
		if o, ok := r.ops.Take(r.rwrs[j].ID); ok {
			o.Buf.Release()
			r.life.OpDone()
		}
	}
}

// isClosed reports whether c is closed, without blocking.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Drop ends delivery at the teardown: the messages that arrived and were
// not handed over go back to the pool, Done closes, and the Recvs still
// waiting fail with err.
func (r *Receiver) Drop(err error) {
	r.rmu.Lock()
	for _, m := range r.ready.Take() {
		if m.Buf != nil {
			m.Buf.Release()
		}
	}
	ws := r.waiters.Take()
	if !r.ended {
		// Nothing more is delivered: a handler still running (it
		// may be the caller) has its message already.
		r.ended = true
		close(r.done)
	}
	r.rmu.Unlock()
	for _, w := range ws {
		w.Deliver(err, 0, 0, false, nil)
	}
}

// Abandon gives up on the receives the device will never complete (see
// the connection's abandonPosted): the Recvs still waiting fail with
// the connection's error now.
func (r *Receiver) Abandon() {
	r.rmu.Lock()
	r.abandoned = true
	ws := r.waiters.Take()
	r.endIfDeliveredLocked()
	r.rmu.Unlock()
	err := r.life.Err()
	for _, w := range ws {
		w.Deliver(err, 0, 0, false, nil)
	}
}

// Settled reports whether the end has settled but for a handler that
// may still run: the connection failed, no message waits, and none can
// still come (tests).
func (r *Receiver) Settled() bool {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.endIfDeliveredLocked()
	return r.life.Err() != nil && r.ready.Len() == 0 && !r.moreToComeLocked()
}

// The dialer's go, on iWARP: a go-rdma listener holds its sends until
// the dialer's first message, a zero-length SEND, has come (MPA lets
// the listener speak only after the dialer).

// AwaitGo makes a listener's connection wait for the dialer's go before
// it sends: its sends queue until the go arrives. A dialer that never
// sends it fails the connection after bound. It runs before the accept,
// so before anything can arrive.
func (r *Receiver) AwaitGo(bound time.Duration) {
	r.awaitingGo.Store(true)
	r.sq.Hold()
	r.goBound = time.AfterFunc(bound, func() {
		if r.awaitingGo.Load() {
			r.owner.Fail(fmt.Errorf("rdma: peer %v: %w: no first message from the dialer within the handshake's bound", r.life.remote, ErrProtocol))
		}
	})
}

// StopGo stops the go's bound, at the teardown.
func (r *Receiver) StopGo() {
	if r.goBound != nil {
		r.goBound.Stop()
	}
}

// takeGoLocked reports whether a receive completion is the dialer's go,
// which a listener's connection that awaits it takes instead of
// delivering: the first message to arrive, a zero-length SEND. A first
// message with bytes breaks the protocol: err says so, for the caller to
// fail the connection with once it has unlocked rmu. Caller holds rmu.
func (r *Receiver) takeGoLocked(pb *pool.Buffer, wc *verbs.WorkCompletion) (taken bool, err error) {
	if wc.Status != verbs.WCSuccess || !r.awaitingGo.CompareAndSwap(true, false) {
		return false, nil
	}
	r.goBound.Stop()
	pb.Release()
	if wc.ByteLen != 0 || wc.Opcode != verbs.WCRecv {
		return true, fmt.Errorf("rdma: peer %v: %w: its first message on iWARP is no go (%d bytes)", r.life.remote, ErrProtocol, wc.ByteLen)
	}
	r.repostLocked(1) // the go took one of the receives the peer counts on
	return true, nil
}
