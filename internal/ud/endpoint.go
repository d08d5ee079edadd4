// Package ud is the datagram endpoint: a UD queue pair on an engine
// (internal/engine), the receives it keeps posted from the engine's
// pool, the datagrams waiting for ReadFrom, and the UDP side channel
// that maps a peer's ip:port to its UD QP number and Q_Key.
//
// # Addresses
//
// An endpoint's address is the ip:port of a UDP socket it binds beside
// its QP, as rsockets does for its datagram sockets. To write to an
// ip:port it has not met, the endpoint sends that socket a request (a
// random nonce and its own route) and takes the answer with the same
// nonce from the same address; the answer carries the peer's QP number,
// Q_Key, GID, LID and MTU. A request announces its sender too: the
// answerer caches the requester's route before it answers, so the first
// datagram the requester sends after the answer is already known by the
// time it arrives, and ReadFrom reports it from the requester's ip:port.
// Both are cached in one bounded cache (DefaultMaxPeers).
//
// A datagram from a sender no request announced (its entry was evicted,
// or it is not a go-rdma endpoint) is reported from an address known by
// route only: the GRH's source IP, port 0, and the sender's QP number,
// which WriteTo accepts, so a reply reaches it all the same.
//
// The side channel is as trustworthy as UDP: a peer's messages are
// checked for size and form, answers that match no request of ours are
// dropped, answers are rate-bounded and never larger than the request,
// and where GIDs are IP addresses (RoCE, and the soft provider on the
// address it listens on) a peer can announce only a GID of the address
// it sends from. A host that can spoof UDP source addresses can
// misdirect datagrams, as it can for UDP itself.
//
// # Multicast
//
// An endpoint joins groups and writes to group:port without the side
// channel; multicast.go says how the port travels and is checked.
package ud

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// QKey is the Q_Key of every endpoint: a constant of the library's,
// rather than one derived from the port or chosen at random, because a
// Q_Key is no secret on RoCE (every datagram carries it in the clear) and
// a constant lets a reply go to a sender known only from its datagram
// (its GRH and source QPN) without asking it for its Q_Key. Its high bit
// is clear: a Q_Key with the high bit set is privileged ("use the QP's
// own") in a send. It is "RDMA" in ASCII.
const QKey uint32 = 0x52444d41

// Defaults of Config.
const (
	DefaultRecvDepth = 256
	DefaultSendDepth = 128
	// DefaultRefreshAfter: a peer that restarted on the same ip:port
	// with a new queue pair is found again within about this long of
	// traffic to it, for a 64-byte request and answer per peer this
	// often.
	DefaultRefreshAfter = 30 * time.Second
)

// Resolving an address: requests sent at most resolveTries times, the
// first wait resolveWait, doubling up to a second (about 3 s in all);
// at most maxResolving addresses resolved at once.
const (
	resolveTries = 6
	resolveWait  = 50 * time.Millisecond
	maxResolving = 256
)

// Answers to requests: at most answerRate a second, in bursts of
// answerBurst.
const (
	answerRate  = 1000
	answerBurst = 100
)

// Config is an endpoint's settings.
type Config struct {
	SendDepth int // datagrams in flight; 0: DefaultSendDepth
	RecvDepth int // receives posted, and datagrams waiting for ReadFrom; 0: DefaultRecvDepth
	MaxPeers  int // the peer cache's bound; 0: DefaultMaxPeers
	// RefreshAfter is how old a peer's route may be before a WriteTo
	// to it asks its side channel again, in the background, using the
	// route it has meanwhile; 0: DefaultRefreshAfter.
	RefreshAfter time.Duration
	// Wrap makes the API's address for each address ReadFrom reports,
	// once per peer (Addr.Ext); nil: none.
	Wrap func(*Addr) net.Addr
}

// Stats are an endpoint's counters. The API converts them to
// rdma.PacketStats, whose fields say what each counts: the two keep the
// same fields in the same order.
type Stats struct {
	Sent, Received                                       uint64
	DroppedQueueFull, DroppedBadHeader, DroppedMulticast uint64
	NotReposted, RecvErrors                              uint64
	Resolved, ResolveFailed, Answered, Ignored           uint64
	Peers                                                int
	Evicted                                              uint64
}

// Endpoint is a UD queue pair with its receives, its side channel and
// its peer cache.
type Endpoint struct {
	eng     *engine.Engine
	udp     *net.UDPConn
	local   *Addr
	route   Route // this endpoint's, as its answers announce it
	mtu     int
	refresh time.Duration // Config.RefreshAfter
	qp      verbs.QP
	unit    *engine.Unit
	slot    engine.Slot
	slotted bool // slot is the endpoint's
	cqNeed  int
	kick    *poller.Poller // an Adaptive poller to kick after a post
	drv     *poller.Poller // a Busy poller, which a waiting reader drives (recv.go)
	// ready is set when a datagram is queued, or when a reader must stop
	// waiting (its deadline passed, Close, Fail): a reader that drives
	// the poller (next) stops then.
	ready    atomic.Uint32
	peers    *peers
	mc       groups // multicast.go
	checkGID bool   // peers' GIDs must be the IP they send from

	done      chan struct{} // closed by Close
	failed    chan struct{} // closed by Fail
	failOnce  sync.Once
	failErr   error // set before failed closes
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	// WRs posted and not completed; drained closes when Close has moved
	// the QP to ERR and the last has completed.
	posted    atomic.Int64
	drained   chan struct{}
	drainOnce sync.Once

	// Receives posted: recvs[i] is the payload buffer of receive i, nil
	// when not posted; its GRH goes to grhs[i*GRHSize:], a second SGE,
	// so that the payload starts its buffer (RecvFrom hands it out as
	// it is) and the buffer is of the MTU's size class, not the next.
	// unposted counts the nil ones Close has not caused.
	rmu      sync.Mutex
	recvs    []*pool.Buffer
	grhs     *pool.Buffer
	rwr      [1]verbs.RecvWR
	rsge     [2]verbs.SGE
	unposted atomic.Int32

	// Datagrams waiting for ReadFrom: a ring of RecvDepth.
	qmu   sync.Mutex
	q     []datagram
	qhead int
	qlen  int
	avail chan struct{} // a datagram may be waiting

	// Sends: a token in room per free slot of sends.
	room  chan struct{}
	smu   sync.Mutex
	sends []sendSlot
	sfree []uint32
	swr   [1]verbs.SendWR
	ssge  [1]verbs.SGE
	bwr   []verbs.SendWR // a batch's chain (SendBatch)
	bsge  []verbs.SGE

	rdl, wdl *deadline

	pmu     sync.Mutex
	pending map[netip.AddrPort]*resolveCall
	wg      sync.WaitGroup // the side channel's reader, the resolves

	st struct {
		sent, received, queueFull, badHeader, notReposted, recvErrors, droppedMcast atomic.Uint64
		resolved, resolveFailed, answered, ignored                                  atomic.Uint64
	}
}

// recvBit marks a receive's wr_id; the low bits are its index.
const recvBit = 1 << 31

// Listen opens an endpoint on eng bound to the UDP address bind. The
// caller holds a reference to eng for the endpoint's life.
func Listen(eng *engine.Engine, bind netip.AddrPort, cfg Config) (*Endpoint, error) {
	if err := eng.Lacks(verbs.FeatureUD); err != nil {
		return nil, err
	}
	if cfg.SendDepth <= 0 {
		cfg.SendDepth = DefaultSendDepth
	}
	if cfg.RecvDepth <= 0 {
		cfg.RecvDepth = DefaultRecvDepth
	}
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = DefaultMaxPeers
	}
	if cfg.RefreshAfter <= 0 {
		cfg.RefreshAfter = DefaultRefreshAfter
	}
	if err := eng.CheckDepths(cfg.SendDepth, cfg.RecvDepth); err != nil {
		return nil, err
	}
	gid, err := eng.GIDFor(bind.Addr())
	if err != nil {
		return nil, err
	}
	mtu := eng.Port.ActiveMTU.Bytes()
	if mtu == 0 {
		mtu = verbs.MTU1024.Bytes() // the port does not say: the least RoCE has
	}
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(bind))
	if err != nil {
		return nil, err
	}
	la := udp.LocalAddr().(*net.UDPAddr).AddrPort()
	e := &Endpoint{
		eng: eng, udp: udp, local: NewAddr(la), mtu: mtu, refresh: cfg.RefreshAfter,
		checkGID: eng.Port.LinkLayer == "Ethernet" && gid.GID.IP() == la.Addr().Unmap(),
		done:     make(chan struct{}), failed: make(chan struct{}), drained: make(chan struct{}),
		recvs: make([]*pool.Buffer, cfg.RecvDepth), q: make([]datagram, cfg.RecvDepth), avail: make(chan struct{}, 1),
		room: make(chan struct{}, cfg.SendDepth), sends: make([]sendSlot, cfg.SendDepth),
		rdl: newDeadline(), wdl: newDeadline(), pending: map[netip.AddrPort]*resolveCall{},
	}
	e.rdl.onPass = func() { e.ready.Store(1) }
	for i := cfg.SendDepth - 1; i >= 0; i-- {
		e.sfree = append(e.sfree, uint32(i))
		e.room <- struct{}{}
	}
	mkAH := func(r Route) (verbs.AH, error) {
		return eng.PD.CreateAH(verbs.Address{Port: eng.Port.Port, LID: r.LID, GID: r.GID, SGIDIndex: uint8(gid.Index), HopLimit: 64})
	}
	e.peers = newPeers(cfg.MaxPeers, mkAH, cfg.Wrap)
	e.mc.sendTo = newPeers(maxSendGroups, mkAH, nil)
	e.mc.max = MaxGroups
	if m := eng.Attr.MaxMcastGrp; m > 0 && m < MaxGroups {
		e.mc.max = m
	}
	if err := e.open(cfg); err != nil {
		e.teardown()
		return nil, err
	}
	e.route = Route{GID: gid.GID, LID: eng.Port.LID, QPN: e.qp.QPN(), QKey: QKey, MTU: mtu}
	if err := e.postRecvs(); err != nil {
		e.teardown()
		return nil, err
	}
	e.wg.Add(1)
	go e.serveSide()
	return e, nil
}

// open makes the QP, in RTS, with its slot and CQ room.
func (e *Endpoint) open(cfg Config) error {
	eng := e.eng
	var err error
	if e.slot, err = eng.AddEndpoint(e); err != nil {
		return err
	}
	e.slotted = true
	e.cqNeed = cfg.SendDepth + cfg.RecvDepth
	if e.unit, err = eng.Reserve(e, e.cqNeed); err != nil {
		e.unit = nil
		return err
	}
	switch eng.Cfg.PollMode {
	case poller.Adaptive:
		e.kick = e.unit.P
	case poller.Busy:
		e.drv = e.unit.P
	}
	qc := verbs.QPCap{MaxSendWR: cfg.SendDepth, MaxRecvWR: cfg.RecvDepth, MaxSendSGE: 1, MaxRecvSGE: 2}
	if e.qp, err = eng.PD.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: e.unit.CQ, RecvCQ: e.unit.CQ, Cap: qc}); err != nil {
		return fmt.Errorf("rdma: create UD QP: %w", err)
	}
	if err = e.qp.ToInit(verbs.InitAttr{Port: eng.Port.Port, QKey: QKey}); err == nil {
		if err = e.qp.ToRTR(verbs.RTRAttr{}); err == nil {
			err = e.qp.ToRTS(verbs.RTSAttr{SQPSN: uint32(randUint64()) & 0xffffff})
		}
	}
	if err != nil {
		return fmt.Errorf("rdma: UD QP %#x to RTS: %w", e.qp.QPN(), err)
	}
	return nil
}

// LocalAddr is the endpoint's address: its side channel's ip:port.
func (e *Endpoint) LocalAddr() *Addr { return e.local }

// MaxDatagram is the largest datagram the endpoint sends or receives:
// the port's active MTU (a UD message is one packet, and its payload may
// fill the MTU).
func (e *Endpoint) MaxDatagram() int { return e.mtu }

// Closed reports whether Close was called.
func (e *Endpoint) Closed() bool { return e.closed.Load() }

// QPN is the endpoint's UD QP number.
func (e *Endpoint) QPN() uint32 { return e.qp.QPN() }

// Stats reads the endpoint's counters.
func (e *Endpoint) Stats() Stats {
	s := &e.st
	e.peers.mu.Lock()
	n, ev := e.peers.lru.Len(), e.peers.evicted
	e.peers.mu.Unlock()
	return Stats{Sent: s.sent.Load(), Received: s.received.Load(), DroppedQueueFull: s.queueFull.Load(),
		DroppedBadHeader: s.badHeader.Load(), DroppedMulticast: s.droppedMcast.Load(), NotReposted: s.notReposted.Load(), RecvErrors: s.recvErrors.Load(),
		Resolved: s.resolved.Load(), ResolveFailed: s.resolveFailed.Load(), Answered: s.answered.Load(),
		Ignored: s.ignored.Load(), Peers: n, Evicted: ev}
}

// SetReadDeadline sets the deadline of ReadFrom calls, pending ones too.
func (e *Endpoint) SetReadDeadline(t time.Time) { e.rdl.set(t) }

// SetWriteDeadline sets the deadline of WriteTo calls, pending ones too.
func (e *Endpoint) SetWriteDeadline(t time.Time) { e.wdl.set(t) }

// endErr is why the endpoint can do no more, or nil.
func (e *Endpoint) endErr() error {
	if e.closed.Load() {
		return verbs.ErrClosed
	}
	select {
	case <-e.failed:
		return e.failErr
	default:
		return nil
	}
}

// Complete handles the completion of a receive or a send; it runs on the
// engine's poller.
func (e *Endpoint) Complete(wc *verbs.WorkCompletion) {
	i := int(wc.WRID & (recvBit - 1))
	if wc.WRID&recvBit != 0 {
		e.completeRecv(i, wc)
	} else {
		e.completeSend(i, wc)
	}
	if e.posted.Add(-1) == 0 && e.closed.Load() {
		e.drainOnce.Do(func() { close(e.drained) })
	}
}

// Driver is the endpoint's poller when it is Busy, which a goroutine
// waiting for one of its completions drives (run to completion); else
// nil.
func (e *Endpoint) Driver() *poller.Poller { return e.drv }

// Fail ends the endpoint's traffic with err: its port went down, its
// poller stopped, or a send failed.
func (e *Endpoint) Fail(err error) {
	e.failOnce.Do(func() {
		e.failErr = err
		close(e.failed)
		e.ready.Store(1)
	})
}

// Close closes the endpoint: pending and later calls fail with an error
// wrapping verbs.ErrClosed. It waits for the QP's WRs to flush, then
// gives their buffers back.
func (e *Endpoint) Close() error {
	e.closeOnce.Do(func() {
		// Under the locks of the posters and of the resolves, so that
		// none posts or starts after.
		e.rmu.Lock()
		e.smu.Lock()
		e.pmu.Lock()
		e.closed.Store(true)
		e.pmu.Unlock()
		e.smu.Unlock()
		e.rmu.Unlock()
		close(e.done)
		e.ready.Store(1)
		e.closeErr = e.teardown()
	})
	return e.closeErr
}

// drainWait bounds Close's wait for the QP's WRs to flush. A device that
// never flushes them leaves their buffers unreleased rather than reused
// while it may still write to them.
const drainWait = 5 * time.Second

// teardown releases what Listen made, in reverse.
func (e *Endpoint) teardown() error {
	e.closed.Store(true)
	var errs []error
	errs = append(errs, e.udp.Close())
	e.wg.Wait()
	errs = append(errs, e.leaveAll())
	flushed := true
	if e.qp != nil {
		if e.posted.Load() > 0 {
			e.qp.ToError()
			if e.posted.Load() == 0 {
				e.drainOnce.Do(func() { close(e.drained) })
			}
			t := time.NewTimer(drainWait)
			select {
			case <-e.drained:
			case <-t.C:
				flushed = false
				errs = append(errs, fmt.Errorf("rdma: UD QP %#x: %d WRs not flushed after %v", e.qp.QPN(), e.posted.Load(), drainWait))
			}
			t.Stop()
		}
		if flushed {
			errs = append(errs, e.qp.Close())
		}
	}
	if e.unit != nil && flushed {
		e.eng.Unreserve(e, e.unit, e.cqNeed)
	}
	if e.slotted {
		e.eng.RemoveEndpoint(e.slot)
	}
	for {
		dg, ok := e.pop()
		if !ok {
			break
		}
		dg.pb.Release()
	}
	if e.grhs != nil && flushed {
		e.grhs.Release()
	}
	e.peers.clear()
	e.mc.sendTo.clear()
	e.rdl.stop()
	e.wdl.stop()
	return errors.Join(errs...)
}

func randUint64() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}
