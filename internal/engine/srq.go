package engine

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// A shared receive queue (SRQ) holds the receives of every connection of
// an engine that takes messages of one size, so that the receive memory
// of a process follows its aggregate message rate, not its number of
// connections: an idle connection holds no receive at all.
//
// Credits (credit.go) keep that safe. A sender may send a message only
// with a credit, and every credit outstanding is backed by a posted
// receive: granted ≤ posted ≤ depth. So no message ever finds the SRQ
// empty (no receiver-not-ready retries, which never end with rnr_retry
// 7), and a connection whose application does not read holds at most
// its credit cap (WithQueueDepth's receive depth) of the SRQ: it cannot
// lock the others out.
//
// Receives are posted ahead of the credits, so that credits can be given
// at once: the SRQ keeps some headroom posted beyond the credits
// outstanding and is refilled when it falls to a low watermark. Three
// things refill it: a check after each poll that took receives from it
// (the poller saw them go), the SRQ limit event (the device reports a
// watermark below it, in case the polls fall behind), and a grant that
// finds too few posted.

// SRQ is one shared receive queue of an engine, with receive buffers of
// one size.
type SRQ struct {
	e     *Engine
	users atomic.Int32 // connections on it; changed under e.mu. The last one closes it.
	id    uint8        // in e.srqs and in the wr_ids of its receives
	size  int          // bytes per receive
	depth int          // the most receives posted at once (WithSharedReceives)
	q     verbs.SRQ

	// posted and granted are changed by the completion path without a
	// lock; they move together there (a message uses a credit and a
	// receive), so posted-granted, the headroom, changes only under mu.
	posted  atomic.Int64 // receives posted, not yet taken by a message
	granted atomic.Int64 // credits outstanding over all connections
	held    atomic.Int64 // messages here whose credits are not given back yet
	low     atomic.Int64 // refill when posted falls below this
	// withdrawing are receives posted but reserved for a withdrawal
	// (srq_withdraw.go): grants and refills do not count them.
	withdrawing atomic.Int64
	withdrawn   atomic.Uint64 // receives taken back, for Stats

	entries  []srqEntry           // by index; a receive's buffer until it completes
	free     indexStack           // indices of entries free to post
	mu       sync.Mutex           // posting, grants, waiters
	wq       creditQueue          // connections waiting for credits (credits.go); under mu
	members  map[Grantee]struct{} // the connections on it; under mu
	wrs      []verbs.RecvWR
	sges     []verbs.SGE
	retry    *time.Timer // a refill cut short by the pool limit, or a recall, tries again
	recallAt time.Time   // the last recall of idle credits
	hand     *SRQHand    // a test's hand, with the clock of recallAllAfter (SRQ.now); nil but in tests
	closed   bool

	// The decay look and withdrawals (srq_withdraw.go). wmu is held by a
	// withdrawal, before mu; pair and lastSurplus are under it.
	decay       *time.Timer
	decayArmed  atomic.Bool
	wmu         sync.Mutex
	pair        *withdrawPair
	lastSurplus int64

	refills [RefillCauses]atomic.Uint64 // refills by cause, for tests and Stats
	armed   int64                       // the limit armed on the device, 0 once it fired; under mu
}

type srqEntry struct {
	buf atomic.Pointer[pool.Buffer]
	gen uint32 // under mu while free; read by the completion path after buf
}

// What started a refill: the index of SRQStats.Refills.
const (
	RefillEvent  = iota // the SRQ limit event
	RefillPoll          // the check after a poll
	RefillGrant         // a grant or a waiting connection found too few receives posted
	RefillRetry         // the retry after the pool limit cut a refill short
	RefillCauses        // the number of causes
)

// MaxSharedReceives bounds WithSharedReceives: the receives one shared
// receive queue may post.
const MaxSharedReceives = 1 << srqIndexBits

// A receive of an SRQ has a wr_id of its own kind: bit 63 set, then the
// SRQ, the entry's generation and its index. Connection wr_ids (ops.go)
// never set bit 63: slots stay below 2^20.
//
//	63  62   48 47    40 39      20 19        0
//	[1][  0   ][ srq id ][   gen   ][   index  ]
const (
	srqMark      = 1 << 63
	srqIndexBits = 20
	srqGenMask   = 1<<20 - 1
	maxSRQs      = 16 // message sizes an engine serves at once
)

func isSRQ(wrID uint64) bool { return wrID&srqMark != 0 }

// srqHeadroom is the least headroom kept posted beyond the credits
// outstanding; it grows to a quarter of them. A refill comes when half
// of it is used.
const srqHeadroom = 16

// srqBytes is the receive memory an SRQ may hold by default.
const srqBytes = 64 << 20

// srqRetry is how soon a refill cut short by the pool limit tries again.
const srqRetry = 5 * time.Millisecond

// SRQFor returns the engine's SRQ for receives of size bytes, making it
// on first use, with g on it.
func (e *Engine) SRQFor(size int, g Grantee) (*SRQ, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, e.ClosedErr()
	}
	for i := range e.srqs {
		if s := e.srqs[i].Load(); s != nil && s.size == size {
			s.users.Add(1)
			s.join(g)
			return s, nil
		}
	}
	id := -1
	for i := range e.srqs {
		if e.srqs[i].Load() == nil {
			id = i
			break
		}
	}
	if id < 0 {
		return nil, fmt.Errorf("rdma: %w: an engine serves at most %d message sizes (WithMaxMessage)", verbs.ErrInvalid, maxSRQs)
	}
	depth := e.Cfg.SharedRecvs
	if depth == 0 {
		depth = min(max(srqBytes/size, 256), 1<<14)
	}
	if m := e.Attr.MaxSRQWR; m > 0 && depth > m {
		depth = m
	}
	q, err := e.PD.CreateSRQ(verbs.SRQInit{MaxWR: depth, MaxSGE: 1})
	if err != nil {
		return nil, fmt.Errorf("rdma: create shared receive queue: %w", err)
	}
	depth = min(depth, q.MaxWR())
	s := &SRQ{e: e, id: uint8(id), size: size, depth: depth, q: q, entries: make([]srqEntry, depth)}
	s.users.Store(1)
	s.join(g)
	s.free.init(depth)
	s.retry = time.AfterFunc(time.Hour, func() { s.refill(RefillRetry) })
	s.retry.Stop()
	s.decay = time.AfterFunc(time.Hour, s.decayLook)
	s.decay.Stop()
	e.srqs[id].Store(s)
	return s, nil
}

// Q is the verbs SRQ, for a queue pair to take receives from.
func (s *SRQ) Q() verbs.SRQ { return s.q }

// Depth is the most receives s posts.
func (s *SRQ) Depth() int { return s.depth }

// Size is the size of s's receives.
func (s *SRQ) Size() int { return s.size }

// take returns the buffer of the receive wrID, or nil when the id is
// stale. It runs on the completion path, without a lock.
func (s *SRQ) take(wrID uint64) *pool.Buffer {
	idx := uint32(wrID) & (1<<srqIndexBits - 1)
	if int(idx) >= len(s.entries) {
		return nil
	}
	en := &s.entries[idx]
	pb := en.buf.Load()
	if pb == nil || atomic.LoadUint32(&en.gen) != uint32(wrID>>srqIndexBits)&srqGenMask {
		return nil
	}
	if !en.buf.CompareAndSwap(pb, nil) {
		return nil
	}
	s.free.push(idx)
	s.posted.Add(-1)
	return pb
}

// refill posts receives up to the credits outstanding plus the
// headroom, then gives waiting connections what it can, and arms the
// limit event. It runs on a poller, the engine's event reader, a
// granting goroutine or the retry timer.
func (s *SRQ) refill(cause int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refillLocked(cause)
}

func (s *SRQ) refillLocked(cause int) { s.refillForLocked(cause, 0) }

// refillForLocked is refillLocked with receives posted for extra credits
// about to be given beyond what the waiters want. Caller holds mu.
func (s *SRQ) refillForLocked(cause int, extra int64) {
	if s.closed {
		return
	}
	if cause == RefillEvent {
		s.armed = 0 // the limit is one-shot: it fired
	}
	// Receives for the credits out, for those of the messages here (they
	// go back as the application takes them), for what waiters want,
	// and the headroom.
	g := s.granted.Load() + s.held.Load()
	want := s.wq.wantSum + extra
	// An idle queue (nothing out, no one waiting) keeps no headroom: its
	// first ask refills (srq_withdraw.go takes what an idle queue holds).
	target := int64(0)
	if g+want > 0 {
		target = min(int64(s.depth), g+want+max(srqHeadroom, g/4))
	}
	short := false
	if k := int(target - s.posted.Load() + s.withdrawing.Load()); k > 0 {
		s.refills[cause].Add(1)
		short = s.postLocked(k) < k
	}
	s.serveLocked()
	s.setLowLocked()
	switch {
	case s.wq.reserved != nil:
		// Too few receives are left for the first waiter: the credits of
		// the others come back as far as they are not used.
		s.recallLocked()
	case short && s.posted.Load() < s.low.Load():
		s.retry.Reset(srqRetry)
	}
}

// setLowLocked sets the watermark: the next refill comes when half the
// headroom is used (or soon, when a waiter is left), by the check after
// a poll. The device's limit event, the other way to that refill, is
// armed twice as deep, so that it fires only when the check falls
// behind, and armed again only once it fired or for another depth:
// arming it is a system call on a kernel device, and firing it a device
// event that wakes the engine's event reader. Armed at the watermark,
// both came about every eighth message of a ping-pong
// (docs/history/performance.md). Caller holds mu.
func (s *SRQ) setLowLocked() {
	p := s.posted.Load() - s.withdrawing.Load()
	low := max(1, p-max(1, (p-s.granted.Load()-s.held.Load())/2))
	if low >= int64(s.depth) {
		low = int64(s.depth) - 1
	}
	s.low.Store(low)
	limit := max(1, low-(p-low))
	if low > 0 && p >= limit && limit != s.armed {
		if s.q.SetLimit(int(limit)) == nil {
			s.armed = limit
		}
	}
}

// postLocked posts up to k receives in chains of up to 64 and returns
// how many it posted; the pool limit may cut it short.
func (s *SRQ) postLocked(k int) int {
	const chain = 64
	if s.wrs == nil {
		s.wrs = make([]verbs.RecvWR, chain)
		s.sges = make([]verbs.SGE, chain)
		for i := range s.wrs {
			s.wrs[i].SGL = s.sges[i : i+1]
		}
	}
	done := 0
	for done < k {
		n := 0
		for n < min(chain, k-done) {
			idx, ok := s.free.pop()
			if !ok {
				break
			}
			pb, err := s.e.Pool.GetReceive(s.size)
			if err != nil {
				s.free.push(idx)
				break
			}
			en := &s.entries[idx]
			gen := (atomic.LoadUint32(&en.gen) + 1) & srqGenMask
			atomic.StoreUint32(&en.gen, gen)
			en.buf.Store(pb)
			s.sges[n] = verbs.SGE{Addr: pb.Addr(), Length: uint32(s.size), LKey: pb.LKey()}
			s.wrs[n].ID = srqMark | uint64(s.id)<<40 | uint64(gen)<<srqIndexBits | uint64(idx)
			n++
		}
		if n == 0 {
			break
		}
		s.posted.Add(int64(n)) // before the post: a message may land at once
		m, err := s.q.PostRecv(s.wrs[:n])
		for i := m; i < n; i++ {
			idx := uint32(s.wrs[i].ID) & (1<<srqIndexBits - 1)
			if pb := s.entries[idx].buf.Swap(nil); pb != nil {
				pb.Release()
				s.free.push(idx)
				s.posted.Add(-1)
			}
		}
		done += m
		if err != nil {
			break
		}
	}
	return done
}

// DropSRQ drops a user of s; the last one closes it, so that an engine
// without connections holds no receive. Its QP is closed.
func (e *Engine) DropSRQ(s *SRQ) error {
	e.mu.Lock()
	last := s.users.Add(-1) == 0
	if last {
		e.srqs[s.id].Store(nil)
	}
	e.mu.Unlock()
	if !last {
		return nil
	}
	return s.close()
}

// close releases the receives still posted. The QPs on it are closed.
func (s *SRQ) close() error {
	s.mu.Lock()
	s.closed = true
	s.retry.Stop()
	s.decay.Stop()
	s.mu.Unlock()
	// A withdrawal under way ends within its timeout; then the pair goes
	// before the queue it shares. The receives it took and did not hand
	// back yet are released with the rest below.
	s.wmu.Lock()
	if s.pair != nil {
		s.pair.close()
		s.pair = nil
	}
	s.wmu.Unlock()
	err := s.q.Close()
	for i := range s.entries {
		if pb := s.entries[i].buf.Swap(nil); pb != nil {
			pb.Release()
		}
	}
	return err
}

// Test hooks: the watermark's two refill paths can each be turned off,
// to show that the other keeps the SRQ filled. A grant always refills.
var (
	refillByEvent = atomicTrue()
	refillByPoll  = atomicTrue()
)

// SetRefillPaths turns the refills by the limit event and by the check
// after a poll on or off, for tests; restore turns both on again.
func SetRefillPaths(event, poll bool) (restore func()) {
	refillByEvent.Store(event)
	refillByPoll.Store(poll)
	return func() {
		refillByEvent.Store(true)
		refillByPoll.Store(true)
	}
}

func atomicTrue() *atomic.Bool {
	var b atomic.Bool
	b.Store(true)
	return &b
}

// indexStack is a lock-free stack of indices (a Treiber stack): the
// completion paths of many pollers push, refill pops under the SRQ's
// lock. The head carries a tag against ABA.
type indexStack struct {
	head atomic.Uint64 // tag<<32 | index+1; 0 index+1 means empty
	next []atomic.Uint32
}

func (st *indexStack) init(n int) {
	st.next = make([]atomic.Uint32, n)
	for i := n - 1; i >= 0; i-- {
		st.push(uint32(i))
	}
}

func (st *indexStack) push(i uint32) {
	for {
		h := st.head.Load()
		st.next[i].Store(uint32(h))
		if st.head.CompareAndSwap(h, (h>>32+1)<<32|uint64(i+1)) {
			return
		}
	}
}

func (st *indexStack) pop() (uint32, bool) {
	for {
		h := st.head.Load()
		top := uint32(h)
		if top == 0 {
			return 0, false
		}
		if st.head.CompareAndSwap(h, (h>>32+1)<<32|uint64(st.next[top-1].Load())) {
			return top - 1, true
		}
	}
}

// TrimSRQs withdraws, from every SRQ of e, the receives that the credits
// out and the messages held do not need.
func (e *Engine) TrimSRQs() error {
	var errs []error
	for i := range e.srqs {
		if s := e.srqs[i].Load(); s != nil {
			errs = append(errs, s.trim())
		}
	}
	return errors.Join(errs...)
}

// SRQStats describe an SRQ of an engine.
type SRQStats struct {
	MessageSize int
	Depth       int
	Posted      int64
	Granted     int64
	Held        int64
	Waiting     int
	Withdrawn   uint64
	Refills     [RefillCauses]uint64
}

// Stats reads s's counters.
func (s *SRQ) Stats() SRQStats {
	q := SRQStats{MessageSize: s.size, Depth: s.depth, Posted: s.posted.Load(), Granted: s.granted.Load(), Held: s.held.Load(),
		Withdrawn: s.withdrawn.Load()}
	s.mu.Lock()
	q.Waiting = s.wq.len()
	s.mu.Unlock()
	for k := range q.Refills {
		q.Refills[k] = s.refills[k].Load()
	}
	return q
}

// SRQs lists the engine's shared receive queues.
func (e *Engine) SRQs() []*SRQ {
	var out []*SRQ
	for i := range e.srqs {
		if s := e.srqs[i].Load(); s != nil {
			out = append(out, s)
		}
	}
	return out
}
