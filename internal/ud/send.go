package ud

// The send path: WriteTo, SendBuffer and the checks, peer lookup and
// room they share with SendBatch (batch.go); completeSend gives back what
// a send held.

import (
	"fmt"
	"os"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// sendSlot is what a posted send holds until it completes.
type sendSlot struct {
	pb   *pool.Buffer
	ah   *ahRef
	own  bool     // pb is the endpoint's copy (WriteTo), else a reference to the caller's (SendBuffer)
	n    int      // the datagram's length
	done SendDone // nil for WriteTo
}

// SendDone is told when a datagram SendBuffer posted has left: err is
// nil, or why it could not be sent (a flush when the endpoint closed).
// It runs on the engine's poller and must not block.
type SendDone interface {
	SendDone(err error, n int)
}

// tooLarge is the error of a datagram larger than the path MTU allows.
func tooLarge(n, mtu int, whose string) error {
	return fmt.Errorf("%w: datagram of %d bytes exceeds the %d-byte MTU of %s (a UD datagram is one packet)", verbs.ErrInvalid, n, mtu, whose)
}

// WriteTo sends b as one datagram to a. It returns once b is copied into
// registered memory and posted: as with UDP, nothing says it arrived.
func (e *Endpoint) WriteTo(b []byte, a *Addr) (int, error) {
	d, err := e.admit(len(b), a)
	if err != nil {
		return 0, err
	}
	pb, err := e.eng.Pool.Get(max(len(b), 1))
	if err == nil {
		copy(pb.Bytes(), b)
		if err = e.post(pb, 0, len(b), d, true, nil); err != nil {
			pb.Release()
		}
	}
	if err != nil {
		e.room <- struct{}{}
		return 0, err
	}
	return len(b), nil
}

// SendBuffer sends n bytes of pb at off, memory of the engine's pool, as
// one datagram to a, without a copy: pb is referenced until the send has
// left, and done is told then. An error means nothing was posted and
// done is not told.
func (e *Endpoint) SendBuffer(pb *pool.Buffer, off, n int, a *Addr, done SendDone) error {
	if pb.Pool() != e.eng.Pool {
		return fmt.Errorf("%w: a buffer of another engine's pool", verbs.ErrInvalid)
	}
	d, err := e.admit(n, a)
	if err != nil {
		return err
	}
	if err = pb.Ref(); err == nil {
		if err = e.post(pb, off, n, d, false, done); err != nil {
			pb.Unref()
		}
	}
	if err != nil {
		e.room <- struct{}{}
		return err
	}
	return nil
}

// admit checks a datagram of n bytes to a, finds its peer (asking its
// side channel if need be) and takes room in the send queue for it,
// bounded by the write deadline.
func (e *Endpoint) admit(n int, a *Addr) (dest, error) {
	dl := e.wdl.wait()
	d, err := e.routeTo(n, a, dl)
	if err != nil {
		return dest{}, err
	}
	return d, e.takeRoom(dl)
}

// dest is where a datagram goes: its peer, the cache that holds the
// peer (the peers', or the groups' for a multicast group), and the
// immediate data the datagram carries (a group's destination port;
// 0: none, a unicast datagram).
type dest struct {
	p   *peer
	c   *peers
	imm uint32
}

// ah is the peer's address handle with a reference for one send.
func (d dest) ah() (*ahRef, error) {
	ah, err := d.c.ah(d.p)
	if err != nil {
		return nil, fmt.Errorf("rdma: address handle to %v: %w", d.p.route.GID, err)
	}
	return ah, nil
}

// wr is the work request of a send to d, through ah.
func (d dest) wr(id uint64, sgl []verbs.SGE, ah *ahRef) verbs.SendWR {
	wr := verbs.SendWR{ID: id, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGL: sgl, AH: ah.ah, RemoteQPN: d.p.route.QPN, RemoteQKey: d.p.route.QKey}
	if d.imm != 0 {
		wr.Opcode, wr.Imm = verbs.OpSendWithImm, d.imm
	}
	return wr
}

// routeTo checks a datagram of n bytes to a and finds where it goes: a
// group's entry for a multicast group:port, else the peer's, asking its
// side channel if need be, bounded by the write deadline dl.
func (e *Endpoint) routeTo(n int, a *Addr, dl <-chan struct{}) (dest, error) {
	if err := e.endErr(); err != nil {
		return dest{}, err
	}
	if isClosed(dl) {
		return dest{}, os.ErrDeadlineExceeded
	}
	if n > e.mtu {
		return dest{}, tooLarge(n, e.mtu, "this endpoint's port")
	}
	if !a.hasRoute() && a.ap.Addr().IsMulticast() {
		p, err := e.groupPeer(a)
		if err != nil {
			return dest{}, err
		}
		return dest{p: p, c: e.mc.sendTo, imm: mcastImm(a.ap.Port())}, nil
	}
	p, err := e.peerFor(a, dl)
	if err != nil {
		return dest{}, err
	}
	if n > p.route.MTU {
		return dest{}, tooLarge(n, p.route.MTU, "the peer "+a.String())
	}
	return dest{p: p, c: e.peers}, nil
}

// takeRoom takes room for one datagram in the send queue, bounded by the
// write deadline dl.
func (e *Endpoint) takeRoom(dl <-chan struct{}) error {
	select {
	case <-e.room:
		return nil
	case <-dl:
		return os.ErrDeadlineExceeded
	case <-e.done:
		return verbs.ErrClosed
	case <-e.failed:
		return e.failErr
	}
}

// post posts the send of n bytes of pb at off to d, in room admit took;
// own says whether the send owns pb (else it holds a reference).
func (e *Endpoint) post(pb *pool.Buffer, off, n int, d dest, own bool, done SendDone) error {
	ah, err := d.ah()
	if err != nil {
		return err
	}
	e.smu.Lock()
	if err := e.endErr(); err != nil {
		e.smu.Unlock()
		ah.release()
		return err
	}
	i := e.sfree[len(e.sfree)-1]
	e.sfree = e.sfree[:len(e.sfree)-1]
	e.sends[i] = sendSlot{pb: pb, ah: ah, own: own, n: n, done: done}
	e.ssge[0] = verbs.SGE{Addr: pb.Addr() + uint64(off), Length: uint32(n), LKey: pb.LKey()}
	e.swr[0] = d.wr(e.slot.Base()|uint64(i), e.ssge[:], ah)
	if n == 0 {
		e.swr[0].SGL = nil
	}
	e.posted.Add(1)
	_, err = e.qp.PostSend(e.swr[:])
	e.swr[0] = verbs.SendWR{}
	if err != nil {
		e.sends[i] = sendSlot{}
		e.sfree = append(e.sfree, i)
		e.posted.Add(-1)
		e.smu.Unlock()
		ah.release()
		return fmt.Errorf("rdma: post UD send: %w", err)
	}
	e.smu.Unlock()
	e.st.sent.Add(1)
	if e.kick != nil {
		e.kick.Kick()
	}
	return nil
}

// peerFor finds the peer a names: by the route a datagram brought, else
// by ip:port in the cache, else by asking the address's side channel
// (bounded by the write deadline dl).
func (e *Endpoint) peerFor(a *Addr, dl <-chan struct{}) (*peer, error) {
	if a.hasRoute() {
		if p := e.peers.from(a.route.key()); p != nil {
			return p, nil
		}
		return e.peers.learn(a.ap, a.route), nil
	}
	if !a.ap.IsValid() || a.ap.Port() == 0 || a.ap.Addr().IsUnspecified() {
		return nil, fmt.Errorf("%w: address %v: want ip:port", verbs.ErrInvalid, a.ap)
	}
	if p, stale := e.peers.byAddrPort(a.ap, e.refresh); p != nil {
		if stale {
			e.reask(a.ap)
		}
		return p, nil
	}
	return e.resolve(a.ap, dl)
}

// completeSend gives back what send i held and tells its SendDone.
func (e *Endpoint) completeSend(i int, wc *verbs.WorkCompletion) {
	e.smu.Lock()
	s := e.sends[i]
	e.sends[i] = sendSlot{}
	e.sfree = append(e.sfree, uint32(i))
	e.smu.Unlock()
	if s.own {
		s.pb.Release()
	} else {
		s.pb.Unref()
	}
	s.ah.release()
	e.room <- struct{}{}
	var err error
	if werr := wc.Err(); werr != nil {
		err = fmt.Errorf("rdma: UD send: %w", werr)
		if wc.Status != verbs.WCWRFlushErr {
			e.Fail(err)
		}
	}
	if s.done != nil {
		s.done.SendDone(err, s.n)
	}
}
