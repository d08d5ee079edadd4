package engine

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Unit is one CQ, its completion channel and its poller. Endpoints
// reserve room in it for every WR they can have outstanding, so the CQ
// can never overrun.
type Unit struct {
	CQ   verbs.CQ
	P    *poller.Poller
	ch   verbs.CompChannel
	free int
	eps  map[Endpoint]struct{} // under Engine.mu
}

// CQEntries bounds one endpoint's CQ reservation (its send and receive
// depths); firstCQ and maxCQ bound the CQs an engine makes. Each new CQ
// is twice the size of the last, up to maxCQ and the device's max_cqe,
// so a process with few connections keeps small CQs and one with
// thousands needs few CQs and pollers.
const (
	CQEntries = 8192
	firstCQ   = 4096
	maxCQ     = 1 << 16
)

// Reserve finds a CQ with room for n more entries for ep, making a new
// one (and its poller) when all are full.
func (e *Engine) Reserve(ep Endpoint, n int) (*Unit, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, e.ClosedErr()
	}
	for _, u := range e.units {
		if u.free >= n {
			u.free -= n
			u.eps[ep] = struct{}{}
			return u, nil
		}
	}
	size := firstCQ
	if k := len(e.units); k > 0 {
		size = 2 * e.units[k-1].CQ.Len()
	}
	size = min(max(size, n), maxCQ)
	if e.Attr.MaxCQE > 0 {
		size = min(size, e.Attr.MaxCQE)
	}
	if n > size {
		return nil, fmt.Errorf("rdma: %w: queue depths need %d CQ entries, the device allows %d", verbs.ErrInvalid, n, size)
	}
	u := &Unit{}
	var err error
	// Busy pollers too: they park on it while goroutines wait for a P.
	if u.ch, err = e.Ctx.CreateCompChannel(); err != nil {
		return nil, fmt.Errorf("rdma: %w", err)
	}
	if u.CQ, err = e.Ctx.CreateCQ(size, u.ch); err != nil {
		u.close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	handle := func(wcs []verbs.WorkCompletion) { e.completions(u, wcs) }
	cfg := poller.Config{Mode: e.Cfg.PollMode, Lock: e.Cfg.ThreadLock, CPUs: e.Cfg.CPUs, Spin: e.Cfg.Spin}
	if u.P, err = poller.New(u.CQ, u.ch, poller.HandlerFunc(handle), cfg); err == nil {
		err = u.P.Start()
	}
	if err != nil {
		u.close()
		return nil, fmt.Errorf("rdma: %w", err)
	}
	u.free = u.CQ.Len() - n
	u.eps = map[Endpoint]struct{}{ep: {}}
	e.units = append(e.units, u)
	go e.watch(u)
	return u, nil
}

// Unreserve gives back n entries ep reserved in u.
func (e *Engine) Unreserve(ep Endpoint, u *Unit, n int) {
	e.mu.Lock()
	u.free += n
	delete(u.eps, ep)
	e.mu.Unlock()
}

// Units lists the engine's CQ units.
func (e *Engine) Units() []*Unit {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*Unit(nil), e.units...)
}

// watch fails the endpoints of u if its poller stops on an error: no
// completion of theirs could be delivered any more.
func (e *Engine) watch(u *Unit) {
	<-u.P.Done()
	err := u.P.Err()
	if err == nil {
		return
	}
	e.mu.Lock()
	eps := make([]Endpoint, 0, len(u.eps))
	for ep := range u.eps {
		eps = append(eps, ep)
	}
	e.mu.Unlock()
	for _, ep := range eps {
		ep.Fail(fmt.Errorf("rdma: completion poller stopped: %w", err))
	}
}

func (u *Unit) close() error {
	var errs []error
	if u.P != nil {
		errs = append(errs, u.P.Close())
	}
	if u.CQ != nil {
		errs = append(errs, u.CQ.Close())
	}
	if u.ch != nil {
		errs = append(errs, u.ch.Close())
	}
	return errors.Join(errs...)
}

// completions hands a batch of completions of u's CQ to their endpoints.
// It runs on u's poller and allocates nothing.
func (e *Engine) completions(u *Unit, wcs []verbs.WorkCompletion) {
	var shared uint32 // bit i: SRQ i gave receives
	for i := range wcs {
		wc := &wcs[i]
		if isSRQ(wc.WRID) {
			shared |= 1 << uint8(wc.WRID>>40)
			e.sharedRecv(u, wc)
			continue
		}
		if ep := e.slots.get(wc.WRID); ep != nil {
			ep.Complete(wc)
		}
	}
	// The check after a poll: refill an SRQ that fell below its low
	// watermark, without waiting for the limit event.
	for shared != 0 && refillByPoll.Load() {
		i := bits.TrailingZeros32(shared)
		shared &^= 1 << i
		if s := e.srqs[i%maxSRQs].Load(); s != nil && s.posted.Load() < s.low.Load() {
			s.refill(RefillPoll)
		}
	}
}

// sharedRecv hands a receive of an SRQ to the endpoint whose QP took it.
// A QPN leaves the map only once no completion of its QP is left
// (UnregisterQPN); the CQ check is a second guard.
func (e *Engine) sharedRecv(u *Unit, wc *verbs.WorkCompletion) {
	s := e.srqs[uint8(wc.WRID>>40)%maxSRQs].Load()
	if s == nil {
		return
	}
	pb := s.take(wc.WRID)
	if pb == nil {
		return
	}
	if v, ok := e.qpns.Load(wc.QPN); ok && v.(qpnEntry).u == u {
		v.(qpnEntry).ep.Received(pb, wc)
		return
	}
	pb.Release()
}
