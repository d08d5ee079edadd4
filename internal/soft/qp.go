package soft

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

var (
	errCQOverrun = errors.New("soft: a CQ of the QP overran (completions arrived faster than they were polled)")
	errToError   = errors.New("soft: moved to ERR by ToError")
)

// sendSlot is one send WR as posted: a copy of the WR, its own SGEs and
// its inline data, so the caller's WR and (inline) buffers are free as
// soon as PostSend returns.
type sendSlot struct {
	wr       verbs.SendWR // SGL and AH are nil; see sge and ah
	sge      []verbs.SGE
	inline   []byte
	isInline bool
	signaled bool
	psn      uint32
	length   uint64
	ah       *ah
}

type qp struct {
	lt        verbs.Lifetime
	pd        *pd
	qpn       uint32
	typ       verbs.QPType
	caps      verbs.QPCap
	sendCQ    *cq
	recvCQ    *cq
	srq       *srq
	signalAll bool

	refs inflight
	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex
	idle sync.Cond // broadcast when busy drops to zero
	busy int       // goroutines working on a slot with mu released
	// respBusy counts response payloads being read: progress, so the
	// timeout waits.
	respBusy int
	// pumping: a goroutine is running the send queue (see pumpLocked).
	pumping bool
	// pumpedLocal and pumpedRemote: the worker's pump ran an
	// in-process WR, a WR over the network.
	pumpedLocal, pumpedRemote bool
	state                     verbs.QPState
	epoch                     uint64 // bumped by ERR and RESET: work started before is void
	err                       error  // why the QP entered ERR

	// INIT
	access verbs.Access
	qkey   uint32
	// RTR
	destQPN uint32
	peer    netip.AddrPort
	local   bool
	minRNR  uint8
	rqPSN   uint32 // responder: next expected PSN
	nakSent bool   // responder: an RNR NAK is out; drop until rqPSN comes again
	// RTS
	sqPSN    uint32 // PSN of the next posted WR
	tmo      time.Duration
	rnrRetry uint8
	maxRd    int

	// Send queue: [head, sent) went to the peer and wait for a response
	// (TCP RC only), [sent, tail) wait to go.
	sq           []sendSlot
	head         uint64
	sent         uint64
	tail         uint64
	rewind       uint64 // bumped when an RNR NAK sends the queue back
	rnrLeft      int
	rnrUntil     time.Time
	rdOut        int  // READs and atomics in flight (TCP)
	stalled      bool // the worker waits for a response
	lastProgress time.Time
	// watch wakes the worker to time WRs a poster wrote (see pumpLocked).
	watch      *time.Timer
	watchArmed bool
	handoffs   uint64 // posts that woke the worker to run their WRs
	// unpolled counts this QP's completions of WRs over postRemoteMax
	// in its send CQ, not yet polled: a poster that posts while some
	// are pipelines (see pumpLocked). Small WRs are not counted: their
	// count would cost an atomic per message, and they run inline anyway.
	unpolled atomic.Int32
	// events is set, while a connection reader serves a frame for this
	// QP, to where the reader collects its CQ events (see cq.push).
	events atomic.Pointer[[]*cq]
	conn   *conn
	tx     txBatch // frames staged by whoever pumps
	// The last MRs this QP's inline copies (lkeys) and its responder
	// (rkeys) found; mu guards them.
	lkeys, rkeys keyCache

	rq     []recvSlot
	rqHead uint64
	rqTail uint64

	// Scratch of whoever pumps (see pumpLocked).
	wsrc  sgl
	wdata sglSource
	wresp respScratch
}

// respScratch is what a responder borrows from the goroutine serving it.
type respScratch struct {
	sgl  sgl
	recv recvSlot
	// events collects the CQ events of a connection reader's frame (see
	// cq.push); nil for the in-process requester's scratch.
	events *[]*cq
}

func newRespScratch() respScratch {
	return respScratch{sgl: newSGL(maxSGE), recv: recvSlot{sge: make([]verbs.SGE, 0, maxSGE)}}
}

func (p *pd) CreateQP(attr verbs.QPInit) (verbs.QP, error) {
	if attr.Type != verbs.RC && attr.Type != verbs.UC && attr.Type != verbs.UD {
		return nil, fmt.Errorf("soft: create qp: %w: type %v", verbs.ErrInvalid, attr.Type)
	}
	scq, ok1 := attr.SendCQ.(*cq)
	rcq, ok2 := attr.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.ctx != p.ctx || rcq.ctx != p.ctx {
		return nil, fmt.Errorf("soft: create qp: %w: send and receive CQs must be soft CQs of the PD's context", verbs.ErrInvalid)
	}
	var s *srq
	if attr.SRQ != nil {
		var ok bool
		if s, ok = attr.SRQ.(*srq); !ok || s == nil || s.pd != p {
			return nil, fmt.Errorf("soft: create qp: %w: the SRQ must be a soft SRQ of the same PD", verbs.ErrInvalid)
		}
	}
	c := attr.Cap
	if c.MaxSendWR < 0 || c.MaxSendWR > maxQPWR || c.MaxRecvWR < 0 || c.MaxRecvWR > maxQPWR ||
		c.MaxSendSGE < 0 || c.MaxSendSGE > maxSGE || c.MaxRecvSGE < 0 || c.MaxRecvSGE > maxSGE ||
		c.MaxInlineData < 0 || c.MaxInlineData > maxInline {
		return nil, fmt.Errorf("soft: create qp: %w: caps %+v beyond the device limits (wr %d, sge %d, inline %d)", verbs.ErrInvalid, c, maxQPWR, maxSGE, maxInline)
	}
	g := verbs.QPCap{
		MaxSendWR:     max(c.MaxSendWR, 1),
		MaxRecvWR:     max(c.MaxRecvWR, 1),
		MaxSendSGE:    max(c.MaxSendSGE, 1),
		MaxRecvSGE:    max(c.MaxRecvSGE, 1),
		MaxInlineData: max(c.MaxInlineData, grantInline),
	}
	if s != nil {
		g.MaxRecvWR, g.MaxRecvSGE = 0, 0
	}

	if err := p.lt.AddChild(); err != nil {
		return nil, errClosed("create qp")
	}
	q := &qp{
		pd: p, typ: attr.Type, caps: g, sendCQ: scq, recvCQ: rcq, srq: s, signalAll: attr.SignalAll,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	undo := []func(){p.lt.DropChild}
	fail := func() (verbs.QP, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, errClosed("create qp")
	}
	if err := scq.attach(q); err != nil {
		return fail()
	}
	undo = append(undo, func() { scq.detach(q) })
	if err := rcq.attach(q); err != nil {
		return fail()
	}
	undo = append(undo, func() { rcq.detach(q) })
	if s != nil {
		if err := s.lt.AddChild(); err != nil {
			return fail()
		}
	}
	q.idle.L = &q.mu
	q.refs.init()
	if s == nil {
		q.rq = newRecvRing(g.MaxRecvWR, g.MaxRecvSGE)
	}
	q.wsrc = newSGL(g.MaxSendSGE)
	q.wresp = newRespScratch()
	q.watch = time.AfterFunc(time.Hour, q.onWatch)
	q.watch.Stop()
	addQP(q)
	go q.worker()
	return q, nil
}

func (q *qp) QPN() uint32        { return q.qpn }
func (q *qp) Type() verbs.QPType { return q.typ }
func (q *qp) Cap() verbs.QPCap   { return q.caps }
func (q *qp) ctx() *devContext   { return q.pd.ctx }
func (q *qp) String() string     { return fmt.Sprintf("soft %v QP %#x", q.typ, q.qpn) }

// remote is the peer an RC or UC QP is connected to.
func (q *qp) remote() netip.AddrPort {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.peer
}

func (q *qp) State() (verbs.QPState, error) {
	if !q.lt.Enter() {
		return 0, errClosed("query qp")
	}
	defer q.lt.Exit()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state, nil
}

// QPError is why a soft QP entered the error state: a remote access
// error, a vanished peer, a malformed frame, a CQ overrun, ... It is nil
// while the QP is not in ERR, and for QPs of other providers.
func QPError(v verbs.QP) error {
	q, ok := v.(*qp)
	if !ok {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != verbs.StateError {
		return nil
	}
	return q.err
}

func stateErr(q *qp, op string, want string) error {
	return fmt.Errorf("soft: %s on QP %#x in state %v (needs %s): %w", op, q.qpn, q.state, want, verbs.ErrQPState)
}

func (q *qp) ToInit(a verbs.InitAttr) error {
	if !q.lt.Enter() {
		return errClosed("modify qp")
	}
	defer q.lt.Exit()
	if a.Port != 1 || a.PKeyIndex != 0 {
		return fmt.Errorf("soft: modify qp to INIT: %w: port %d, pkey index %d (soft0 has port 1 and pkey index 0)", verbs.ErrInvalid, a.Port, a.PKeyIndex)
	}
	const remote = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	if a.Access&^remote != 0 {
		return fmt.Errorf("soft: modify qp to INIT: %w: access %v", verbs.ErrInvalid, a.Access)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != verbs.StateReset && q.state != verbs.StateInit {
		return stateErr(q, "modify qp to INIT", "RESET or INIT")
	}
	q.access = a.Access
	q.qkey = a.QKey
	q.state = verbs.StateInit
	return nil
}

func (q *qp) ToRTR(a verbs.RTRAttr) error {
	if !q.lt.Enter() {
		return errClosed("modify qp")
	}
	defer q.lt.Exit()
	var peer netip.AddrPort
	local := false
	if q.typ != verbs.UD {
		if a.PathMTU.Bytes() == 0 {
			return fmt.Errorf("soft: modify qp to RTR: %w: path MTU %d", verbs.ErrInvalid, a.PathMTU)
		}
		if a.DestQPN > qpnMask {
			return fmt.Errorf("soft: modify qp to RTR: %w: dest QPN %#x beyond 24 bits", verbs.ErrInvalid, a.DestQPN)
		}
		var err error
		if peer, err = routeOf(a.Dest); err != nil {
			return fmt.Errorf("soft: modify qp to RTR: %w", err)
		}
		local = dev.local(peer)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != verbs.StateInit {
		return stateErr(q, "modify qp to RTR", "INIT")
	}
	q.destQPN = a.DestQPN
	q.peer = peer
	q.local = local
	q.minRNR = a.MinRNRTimer & 31
	q.rqPSN = a.RQPSN & psnMask
	q.nakSent = false
	q.state = verbs.StateRTR
	return nil
}

func (q *qp) ToRTS(a verbs.RTSAttr) error {
	if !q.lt.Enter() {
		return errClosed("modify qp")
	}
	defer q.lt.Exit()
	q.mu.Lock()
	switch q.state {
	case verbs.StateRTR:
		q.sqPSN = a.SQPSN & psnMask
	case verbs.StateRTS:
	default:
		q.mu.Unlock()
		return stateErr(q, "modify qp to RTS", "RTR or RTS")
	}
	q.tmo = ackTimeout(a.Timeout, a.RetryCount)
	q.rnrRetry = min(a.RNRRetry, 7)
	q.rnrLeft = int(q.rnrRetry)
	q.maxRd = min(max(int(a.MaxRdAtomic), 1), maxRdAtomic)
	q.state = verbs.StateRTS
	q.mu.Unlock()
	q.wake()
	return nil
}

func (q *qp) ToError() error {
	if !q.lt.Enter() {
		return errClosed("modify qp")
	}
	defer q.lt.Exit()
	q.mu.Lock()
	q.enterErr(errToError)
	q.mu.Unlock()
	handleOverflows()
	return nil
}

func (q *qp) ToReset() error {
	if !q.lt.Enter() {
		return errClosed("modify qp")
	}
	defer q.lt.Exit()
	q.mu.Lock()
	for q.busy > 0 {
		q.idle.Wait()
	}
	q.reset()
	q.mu.Unlock()
	return nil
}

// reset discards every WR without completions.
// firstSendSlots is the size of a QP's send queue at its first post.
const firstSendSlots = 8

// growSendSlots makes the send queue at the first post, and doubles it,
// up to the QP's MaxSendWR, when it is full: a QP that never sends (an
// idle connection) costs none of it, and one that has sent a few WRs at
// a time no more than they took (a slot is about 200 bytes, and a
// connection's send depth 130 of them). Slots are found by their WR's
// count modulo the size (head, sent, tail), so the WRs in the queue keep
// their order in the larger ring. A goroutine that works on a slot with
// mu released holds a pointer into the ring: growth waits until none
// does. Caller holds mu; it may be released meanwhile.
func (q *qp) growSendSlots() {
	for q.busy > 0 {
		q.idle.Wait()
	}
	g := q.caps
	old := q.sq
	n := min(max(2*len(old), firstSendSlots), g.MaxSendWR)
	if n <= len(old) {
		return
	}
	sq := make([]sendSlot, n)
	sges := make([]verbs.SGE, n*g.MaxSendSGE)
	for i := range sq {
		sq[i].sge = sges[i*g.MaxSendSGE : i*g.MaxSendSGE : (i+1)*g.MaxSendSGE]
	}
	for c := q.head; c < q.tail; c++ {
		s, o := &sq[c%uint64(n)], &old[c%uint64(len(old))]
		sge := append(s.sge, o.sge...)
		*s = *o
		s.sge = sge
	}
	q.sq = sq
}

func (q *qp) reset() {
	q.state = verbs.StateReset
	q.epoch++
	q.err = nil
	for i := range q.sq {
		q.sq[i].ah = nil
	}
	q.head, q.sent, q.tail = 0, 0, 0
	q.rqHead, q.rqTail = 0, 0
	q.rnrUntil = time.Time{}
	q.rdOut, q.stalled = 0, false
	q.access, q.qkey, q.destQPN, q.peer, q.local = 0, 0, 0, netip.AddrPort{}, false
	q.conn = nil
}

func (q *qp) Close() error {
	return q.lt.Close(func() error {
		removeQP(q)
		detachAll(q)
		q.refs.drain()
		close(q.stop)
		<-q.done
		q.watch.Stop()
		q.mu.Lock()
		q.reset()
		q.mu.Unlock()
		q.sendCQ.detach(q)
		q.recvCQ.detach(q)
		if q.srq != nil {
			q.srq.lt.DropChild()
		}
		q.pd.lt.DropChild()
		return nil
	})
}

// wake kicks the worker without blocking.
func (q *qp) wake() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// enterErr moves the QP to ERR: every outstanding send and receive WR
// completes with WR_FLUSH_ERR, in order. Work running with mu released
// notices the new epoch and drops its result. Caller holds mu.
func (q *qp) enterErr(reason error) {
	if q.state == verbs.StateError {
		return
	}
	if q.err == nil {
		q.err = reason
	}
	q.state = verbs.StateError
	q.epoch++
	for ; q.head != q.tail; q.head++ {
		s := &q.sq[q.head%uint64(len(q.sq))]
		q.completeSend(s, verbs.WCWRFlushErr, 0)
		s.ah = nil
	}
	q.sent = q.head
	q.rdOut, q.stalled = 0, false
	q.rnrUntil = time.Time{}
	for ; q.rqHead != q.rqTail; q.rqHead++ {
		r := &q.rq[q.rqHead%uint64(len(q.rq))]
		q.recvCQ.push(verbs.WorkCompletion{WRID: r.id, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn}, false, q.events.Load())
	}
	if q.srq != nil {
		q.ctx().event(verbs.EventQPLastWQEReached, q.qpn)
	}
}

// fatal moves the QP to ERR for a reason found outside its own work.
func (q *qp) fatal(reason error) {
	q.mu.Lock()
	wasErr := q.state == verbs.StateError
	q.enterErr(reason)
	q.mu.Unlock()
	if !wasErr {
		q.ctx().event(verbs.EventQPFatal, q.qpn)
	}
}

func (q *qp) completeSend(s *sendSlot, st verbs.WCStatus, vendor uint32) {
	if st == verbs.WCSuccess && !s.signaled {
		return
	}
	wc := verbs.WorkCompletion{WRID: s.wr.ID, Status: st, Opcode: verbs.WCOpcodeOf(s.wr.Opcode), QPN: q.qpn, VendorErr: vendor}
	if st == verbs.WCSuccess {
		wc.ByteLen = uint32(s.length)
	}
	var owner *qp
	if s.length > postRemoteMax {
		owner = q // counted in unpolled: see pumpLocked
	}
	q.sendCQ.pushOwned(wc, false, q.events.Load(), owner)
}

// completeHead completes the oldest WR successfully.
func (q *qp) completeHead() {
	s := &q.sq[q.head%uint64(len(q.sq))]
	q.completeSend(s, verbs.WCSuccess, 0)
	s.ah = nil
	q.head++
	q.rnrLeft = int(q.rnrRetry)
}

// failHead completes the oldest WR with st and moves the QP to ERR.
func (q *qp) failHead(st verbs.WCStatus, vendor uint32, reason error) {
	if q.head != q.tail {
		s := &q.sq[q.head%uint64(len(q.sq))]
		q.completeSend(s, st, vendor)
		s.ah = nil
		q.head++
	}
	q.enterErr(reason)
}

func postErr(op string, i int, err error) error {
	return &verbs.PostError{Op: op, Posted: i, Err: err}
}

func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	if !q.lt.Enter() {
		return 0, postErr("post_send", 0, errClosed("post_send"))
	}
	q.mu.Lock()
	n, err := q.postSend(wrs)
	handoff := false
	if n > 0 && q.state == verbs.StateRTS {
		// In-process WRs run now, in the caller's goroutine; the rest
		// goes to the worker.
		_, handoff = q.pumpLocked(true)
		if handoff {
			q.handoffs++
		}
	}
	q.mu.Unlock()
	q.lt.Exit()
	if handoff {
		q.wake()
	}
	handleOverflows()
	return n, err
}

func (q *qp) postSend(wrs []verbs.SendWR) (int, error) {
	if q.state != verbs.StateRTS && q.state != verbs.StateError {
		return 0, postErr("post_send", 0, stateErr(q, "post_send", "RTS"))
	}
	for i := range wrs {
		wr := &wrs[i]
		a, length, err := q.checkSend(wr)
		if err != nil {
			return i, postErr("post_send", i, err)
		}
		if q.state == verbs.StateError {
			q.sendCQ.push(verbs.WorkCompletion{WRID: wr.ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCOpcodeOf(wr.Opcode), QPN: q.qpn}, false, nil)
			continue
		}
		if q.tail-q.head == uint64(len(q.sq)) && len(q.sq) < q.caps.MaxSendWR {
			q.growSendSlots()
			if q.state != verbs.StateRTS && q.state != verbs.StateError {
				// It left RTS while growth waited.
				return i, postErr("post_send", i, stateErr(q, "post_send", "RTS"))
			}
		}
		if q.tail-q.head == uint64(len(q.sq)) {
			return i, postErr("post_send", i, fmt.Errorf("%w: send queue holds %d WRs", verbs.ErrQueueFull, len(q.sq)))
		}
		s := &q.sq[q.tail%uint64(len(q.sq))]
		s.isInline = wr.Flags&verbs.SendInline != 0 && carriesData(wr.Opcode)
		if s.isInline {
			if err := q.copyInline(s, wr.SGL, length); err != nil {
				return i, postErr("post_send", i, err)
			}
		}
		s.wr = *wr
		s.wr.SGL, s.wr.AH = nil, nil
		s.sge = append(s.sge[:0], wr.SGL...)
		s.ah = a
		s.length = length
		s.signaled = q.signalAll || wr.Flags&verbs.SendSignaled != 0
		s.psn = q.sqPSN
		q.sqPSN = (q.sqPSN + 1) & psnMask
		q.tail++
	}
	return len(wrs), nil
}

func carriesData(op verbs.Opcode) bool {
	return op == verbs.OpSend || op == verbs.OpSendWithImm || op == verbs.OpWrite || op == verbs.OpWriteWithImm
}

// checkSend applies the rules a post enforces; the WR is refused at the
// post, not completed in error.
func (q *qp) checkSend(wr *verbs.SendWR) (*ah, uint64, error) {
	if len(wr.SGL) > q.caps.MaxSendSGE {
		return nil, 0, fmt.Errorf("%w: WR %d has %d SGEs, the QP allows %d", verbs.ErrInvalid, wr.ID, len(wr.SGL), q.caps.MaxSendSGE)
	}
	if !wr.Opcode.Supports(q.typ) {
		return nil, 0, fmt.Errorf("%w: opcode %v is not supported on a %v QP", verbs.ErrInvalid, wr.Opcode, q.typ)
	}
	var n uint64
	for _, e := range wr.SGL {
		n += uint64(e.Length)
	}
	if wr.Opcode.IsAtomic() {
		if len(wr.SGL) != 1 || wr.SGL[0].Length != 8 {
			return nil, 0, fmt.Errorf("%w: an atomic needs exactly one 8-byte SGE", verbs.ErrInvalid)
		}
		if wr.RemoteAddr%8 != 0 {
			return nil, 0, fmt.Errorf("%w: atomic on unaligned remote address %#x", verbs.ErrInvalid, wr.RemoteAddr)
		}
	}
	if wr.Flags&verbs.SendInline != 0 && carriesData(wr.Opcode) && n > uint64(q.caps.MaxInlineData) {
		return nil, 0, fmt.Errorf("%w: %d bytes inline, the QP allows %d", verbs.ErrInvalid, n, q.caps.MaxInlineData)
	}
	var a *ah
	if q.typ == verbs.UD {
		var ok bool
		if a, ok = wr.AH.(*ah); !ok || a == nil || a.pd != q.pd {
			return nil, 0, fmt.Errorf("%w: a UD send needs an address handle of the QP's PD", verbs.ErrInvalid)
		}
	}
	return a, n, nil
}

// copyInline copies the data of an inline WR now, checked against lkeys.
func (q *qp) copyInline(s *sendSlot, sges []verbs.SGE, n uint64) error {
	if uint64(cap(s.inline)) < n {
		// Made when a slot first carries that much inline, in 64-byte
		// steps: an idle QP holds none, and one that sends small
		// messages inline holds 64 bytes a slot, not MaxInlineData.
		s.inline = make([]byte, 0, (n+63)&^63)
	}
	s.inline = s.inline[:n]
	off := 0
	for _, e := range sges {
		if e.Length == 0 {
			continue
		}
		m := q.lkeys.get(e.LKey, false)
		if m == nil {
			return fmt.Errorf("%w: inline SGE with unknown lkey %#x", verbs.ErrInvalid, e.LKey)
		}
		b, ok := m.slice(e.Addr, uint64(e.Length))
		if !ok || m.pd != q.pd {
			m.refs.release()
			return fmt.Errorf("%w: inline SGE %#x+%d outside its MR or of another PD", verbs.ErrInvalid, e.Addr, e.Length)
		}
		off += copy(s.inline[off:], b)
		m.refs.release()
	}
	return nil
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if !q.lt.Enter() {
		return 0, postErr("post_recv", 0, errClosed("post_recv"))
	}
	q.mu.Lock()
	n, err := q.postRecv(wrs)
	q.mu.Unlock()
	q.lt.Exit()
	handleOverflows()
	return n, err
}

func (q *qp) postRecv(wrs []verbs.RecvWR) (int, error) {
	if q.srq != nil {
		return 0, postErr("post_recv", 0, fmt.Errorf("%w: QP %#x takes its receives from an SRQ", verbs.ErrInvalid, q.qpn))
	}
	if q.state == verbs.StateReset {
		return 0, postErr("post_recv", 0, stateErr(q, "post_recv", "INIT, RTR or RTS"))
	}
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > q.caps.MaxRecvSGE {
			return i, postErr("post_recv", i, fmt.Errorf("%w: WR %d has %d SGEs, the QP allows %d", verbs.ErrInvalid, wr.ID, len(wr.SGL), q.caps.MaxRecvSGE))
		}
		if q.state == verbs.StateError {
			q.recvCQ.push(verbs.WorkCompletion{WRID: wr.ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn}, false, nil)
			continue
		}
		if q.rqTail-q.rqHead == uint64(len(q.rq)) {
			return i, postErr("post_recv", i, fmt.Errorf("%w: receive queue holds %d WRs", verbs.ErrQueueFull, len(q.rq)))
		}
		r := &q.rq[q.rqTail%uint64(len(q.rq))]
		r.id = wr.ID
		r.sge = append(r.sge[:0], wr.SGL...)
		q.rqTail++
	}
	return len(wrs), nil
}

// takeRecv takes the oldest receive (from the SRQ if there is one) into
// r. Caller holds mu.
func (q *qp) takeRecv(r *recvSlot) bool {
	if q.srq != nil {
		return q.srq.pop(r)
	}
	if q.rqHead == q.rqTail {
		return false
	}
	s := &q.rq[q.rqHead%uint64(len(q.rq))]
	r.id = s.id
	r.sge = append(r.sge[:0], s.sge...)
	q.rqHead++
	return true
}
