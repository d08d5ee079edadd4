package ud

// The receive path: the receives posted (a GRH slot and a buffer of the
// MTU each), their completions checked and queued, and ReadFrom and Take,
// which wait for the queue.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// datagram is one received, waiting for ReadFrom.
type datagram struct {
	pb   *pool.Buffer // the payload
	addr *Addr
}

// postRecvs posts every receive.
func (e *Endpoint) postRecvs() error {
	e.rmu.Lock()
	defer e.rmu.Unlock()
	var err error
	if e.grhs, err = e.eng.Pool.Get(len(e.recvs) * verbs.GRHSize); err != nil {
		return err
	}
	for i := range e.recvs {
		if err := e.postRecvLocked(i); err != nil {
			return err
		}
	}
	return nil
}

// postRecvLocked posts receive i: its GRH slot, then a buffer of the
// MTU.
func (e *Endpoint) postRecvLocked(i int) error {
	pb, err := e.eng.Pool.GetReceive(e.mtu)
	if err != nil {
		return err
	}
	e.rsge[0] = verbs.SGE{Addr: e.grhs.Addr() + uint64(i*verbs.GRHSize), Length: verbs.GRHSize, LKey: e.grhs.LKey()}
	e.rsge[1] = verbs.SGE{Addr: pb.Addr(), Length: uint32(pb.Len()), LKey: pb.LKey()}
	e.rwr[0] = verbs.RecvWR{ID: e.slot.Base() | recvBit | uint64(i), SGL: e.rsge[:]}
	e.recvs[i] = pb
	e.posted.Add(1)
	if _, err := e.qp.PostRecv(e.rwr[:]); err != nil {
		e.recvs[i] = nil
		e.posted.Add(-1)
		pb.Release()
		return fmt.Errorf("rdma: post UD receive: %w", err)
	}
	return nil
}

// repost posts again the receives that could not be (NotReposted).
func (e *Endpoint) repost() {
	if e.unposted.Load() == 0 {
		return
	}
	e.rmu.Lock()
	defer e.rmu.Unlock()
	for i, pb := range e.recvs {
		if pb != nil || e.closed.Load() {
			continue
		}
		if e.postRecvLocked(i) != nil {
			return
		}
		e.unposted.Add(-1)
	}
}

// ReadFrom takes the next datagram: it copies its payload into p (what
// does not fit is lost, as with UDP) and reports its sender.
func (e *Endpoint) ReadFrom(p []byte) (int, *Addr, error) {
	dg, err := e.next(context.Background())
	if err != nil {
		return 0, nil, err
	}
	n := copy(p, dg.pb.Bytes())
	dg.pb.Release()
	return n, dg.addr, nil
}

// Take takes the next datagram without a copy: its payload's buffer,
// which the caller releases, and its sender. It waits for a datagram,
// the read deadline, Close, or the end of ctx.
func (e *Endpoint) Take(ctx context.Context) (*pool.Buffer, *Addr, error) {
	dg, err := e.next(ctx)
	if err == errCanceled {
		err = ctx.Err()
	}
	if err != nil {
		return nil, nil, err
	}
	return dg.pb, dg.addr, nil
}

var errCanceled = errors.New("canceled")

// next waits for the next datagram, the read deadline, Close, or the end
// of ctx (then it returns errCanceled).
//
// With a Busy poller the waiting goroutine drives the poller itself (run
// to completion, as Future.Wait does): it polls the CQ and dispatches
// until a datagram is queued or the wait must end (ready), so no
// goroutine has to wake it. A reader that cannot drive (another does,
// or the poller will not be driven now) blocks as in the other modes.
func (e *Endpoint) next(ctx context.Context) (datagram, error) {
	cancel := ctx.Done()
	for {
		if err := e.endErr(); err != nil {
			return datagram{}, err
		}
		dl := e.rdl.wait()
		if isClosed(dl) {
			return datagram{}, os.ErrDeadlineExceeded
		}
		if isClosed(cancel) {
			return datagram{}, errCanceled
		}
		if dg, ok := e.pop(); ok {
			e.repost()
			return dg, nil
		}
		if e.drv != nil {
			// Clear ready, then look again: a datagram queued, or a
			// deadline passed, before the clear is seen here, and one
			// after it sets ready and ends the drive.
			e.ready.Store(0)
			if e.qlenNow() > 0 || isClosed(e.rdl.wait()) || isClosed(cancel) || e.endErr() != nil {
				continue
			}
			if e.drv.Drive(ctx, &e.ready) && e.ready.Load() != 0 {
				continue
			}
			e.drv.WaitingAdd(1)
		}
		select {
		case <-e.avail:
		case <-dl:
		case <-cancel:
		case <-e.done:
		case <-e.failed:
		}
		if e.drv != nil {
			e.drv.WaitingAdd(-1)
		}
	}
}

// qlenNow is how many datagrams wait for ReadFrom.
func (e *Endpoint) qlenNow() int {
	e.qmu.Lock()
	defer e.qmu.Unlock()
	return e.qlen
}

// push queues a received datagram for ReadFrom, or drops it when
// RecvDepth wait already.
func (e *Endpoint) push(dg datagram) {
	e.qmu.Lock()
	if e.qlen == len(e.q) || e.closed.Load() {
		e.qmu.Unlock()
		dg.pb.Release()
		e.st.queueFull.Add(1)
		e.st.received.Add(1)
		return
	}
	e.q[(e.qhead+e.qlen)%len(e.q)] = dg
	e.qlen++
	e.st.received.Add(1)
	e.qmu.Unlock()
	if e.drv != nil {
		e.ready.Store(1) // a reader that drives the poller stops
	}
	select {
	case e.avail <- struct{}{}:
	default:
	}
}

func (e *Endpoint) pop() (datagram, bool) {
	e.qmu.Lock()
	defer e.qmu.Unlock()
	if e.qlen == 0 {
		return datagram{}, false
	}
	dg := e.q[e.qhead]
	e.q[e.qhead] = datagram{}
	e.qhead = (e.qhead + 1) % len(e.q)
	e.qlen--
	if e.qlen > 0 {
		select { // another reader may take the next
		case e.avail <- struct{}{}:
		default:
		}
	}
	return dg, true
}

// completeRecv checks a received datagram, queues it for ReadFrom or
// drops it and counts why, and posts its receive again.
func (e *Endpoint) completeRecv(i int, wc *verbs.WorkCompletion) {
	var grh [verbs.GRHSize]byte
	e.rmu.Lock()
	pb := e.recvs[i]
	e.recvs[i] = nil
	copy(grh[:], e.grhs.Bytes()[i*verbs.GRHSize:]) // before the repost lets the device write it again
	if !e.closed.Load() && wc.Status != verbs.WCWRFlushErr {
		if e.postRecvLocked(i) != nil {
			e.unposted.Add(1)
			e.st.notReposted.Add(1)
		}
	}
	e.rmu.Unlock()
	if err := wc.Err(); err != nil {
		pb.Release()
		if wc.Status != verbs.WCWRFlushErr {
			e.st.recvErrors.Add(1)
		}
		return
	}
	// Received counts a datagram once it is dropped or queued (push),
	// and before ReadFrom can take it, so that a count read says where
	// each went.
	n := int(wc.ByteLen) - verbs.GRHSize
	if n < 0 || n > pb.Len() || wc.Flags&verbs.WCWithGRH == 0 {
		pb.Release()
		e.st.badHeader.Add(1)
		e.st.received.Add(1)
		return
	}
	pb.Filled(n)
	g, err := verbs.ParseGRH(grh[:])
	if err != nil {
		pb.Release()
		e.st.badHeader.Add(1)
		e.st.received.Add(1)
		return
	}
	if dst := g.DstGID(); dst.IsMulticast() && !e.keepMulticast(dst, wc) {
		pb.Release()
		e.st.droppedMcast.Add(1)
		e.st.received.Add(1)
		return
	}
	k := routeKey{gid: g.SrcGID(), qpn: wc.SrcQP}
	var addr *Addr
	if p := e.peers.from(k); p != nil {
		addr = p.addr
	} else {
		addr = e.peers.newAddr(netip.AddrPortFrom(g.Src.Unmap(), 0), Route{GID: k.gid, LID: wc.SLID, QPN: k.qpn, QKey: QKey, MTU: e.mtu})
	}
	e.push(datagram{pb: pb, addr: addr})
}

// Received is for receives of a shared receive queue, which a UD
// endpoint does not use.
func (e *Endpoint) Received(pb *pool.Buffer, _ *verbs.WorkCompletion) { pb.Release() }
