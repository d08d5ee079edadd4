package soft

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Device limits, as QueryDevice reports them.
const (
	maxQPWR     = 16384
	maxSGE      = 32
	maxCQE      = 1 << 16
	maxInline   = 1024
	grantInline = 256
	maxRdAtomic = 16
	maxEvents   = 256 // queued async events per Context; older ones are dropped
)

func errClosed(what string) error { return fmt.Errorf("soft: %s: %w", what, verbs.ErrClosed) }

type devContext struct {
	lt   verbs.Lifetime
	info verbs.DeviceInfo
	addr netip.AddrPort // this device as peers name it: GID IP, LID port

	evMu   sync.Mutex
	events []verbs.AsyncEvent
	evWake chan struct{}
	done   chan struct{}
}

func newContext(info verbs.DeviceInfo) *devContext {
	p := info.Ports[0]
	return &devContext{
		info: info, addr: netip.AddrPortFrom(p.GIDs[0].GID.IP(), p.LID),
		evWake: make(chan struct{}, 1), done: make(chan struct{}),
	}
}

func (c *devContext) Info() verbs.DeviceInfo {
	i := c.info
	i.Ports = append([]verbs.PortInfo(nil), c.info.Ports...)
	for k := range i.Ports {
		i.Ports[k].GIDs = append([]verbs.GIDEntry(nil), c.info.Ports[k].GIDs...)
	}
	return i
}

func (c *devContext) QueryDevice() (verbs.DeviceAttr, error) {
	if c.lt.Closed() {
		return verbs.DeviceAttr{}, errClosed("query device")
	}
	return verbs.DeviceAttr{
		FWVer:            c.info.FWVer,
		NodeGUID:         c.info.NodeGUID,
		MaxMRSize:        1 << 40,
		MaxQP:            1 << 16,
		MaxQPWR:          maxQPWR,
		MaxSGE:           maxSGE,
		MaxCQ:            1 << 16,
		MaxCQE:           maxCQE,
		MaxMR:            1 << 20,
		MaxPD:            1 << 16,
		MaxQPRdAtom:      maxRdAtomic,
		MaxQPInitRdAtom:  maxRdAtomic,
		MaxSRQ:           1 << 16,
		MaxSRQWR:         maxQPWR,
		MaxSRQSGE:        maxSGE,
		MaxSGERd:         maxSGE,
		AtomicCap:        2,
		PhysPortCnt:      1,
		MaxMcastGrp:      maxMcastGroups,
		MaxMcastQPAttach: maxMcastQPAttach,
	}, nil
}

func (c *devContext) QueryPort(port uint8) (verbs.PortAttr, error) {
	if c.lt.Closed() {
		return verbs.PortAttr{}, errClosed("query port")
	}
	if port != 1 {
		return verbs.PortAttr{}, fmt.Errorf("soft: query port %d: %w (soft0 has only port 1)", port, verbs.ErrInvalid)
	}
	p := c.info.Ports[0]
	return verbs.PortAttr{
		State:       p.State,
		MaxMTU:      p.MaxMTU,
		ActiveMTU:   p.ActiveMTU,
		LID:         p.LID,
		GIDTableLen: len(p.GIDs),
		LinkLayer:   p.LinkLayer,
		MaxMsgSize:  maxMsgSize,
	}, nil
}

func (c *devContext) QueryGID(port uint8, index int) (verbs.GID, error) {
	if c.lt.Closed() {
		return verbs.GID{}, errClosed("query gid")
	}
	if port != 1 || index < 0 || index >= len(c.info.Ports[0].GIDs) {
		return verbs.GID{}, fmt.Errorf("soft: query gid port %d index %d: %w", port, index, verbs.ErrInvalid)
	}
	return c.info.Ports[0].GIDs[index].GID, nil
}

// gid is the source GID this device puts in the GRH of UD messages.
func (c *devContext) gid() verbs.GID { return c.info.Ports[0].GIDs[0].GID }

func (c *devContext) AllocPD() (verbs.PD, error) {
	if err := c.lt.AddChild(); err != nil {
		return nil, errClosed("alloc pd")
	}
	return &pd{ctx: c}, nil
}

func (c *devContext) CreateCompChannel() (verbs.CompChannel, error) {
	if err := c.lt.AddChild(); err != nil {
		return nil, errClosed("create comp channel")
	}
	return &compChannel{ctx: c, wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

func (c *devContext) CreateCQ(cqe int, ch verbs.CompChannel) (verbs.CQ, error) {
	if cqe < 1 || cqe > maxCQE {
		return nil, fmt.Errorf("soft: create cq of %d entries: %w (1..%d)", cqe, verbs.ErrInvalid, maxCQE)
	}
	var cc *compChannel
	if ch != nil {
		var ok bool
		cc, ok = ch.(*compChannel)
		if !ok || cc.ctx != c {
			return nil, fmt.Errorf("soft: create cq: %w: completion channel of another context or provider", verbs.ErrInvalid)
		}
		if err := cc.lt.AddChild(); err != nil {
			return nil, errClosed("create cq: completion channel")
		}
	}
	if err := c.lt.AddChild(); err != nil {
		if cc != nil {
			cc.lt.DropChild()
		}
		return nil, errClosed("create cq")
	}
	n := min(cqe, firstCQEntries)
	return &cq{ctx: c, ch: cc, cqe: cqe, ring: make([]verbs.WorkCompletion, n), owner: make([]*qp, n), qps: map[*qp]int{}}, nil
}

func (c *devContext) AsyncEvent(ctx context.Context) (verbs.AsyncEvent, error) {
	for {
		if c.lt.Closed() {
			return verbs.AsyncEvent{}, errClosed("async event")
		}
		c.evMu.Lock()
		if len(c.events) > 0 {
			e := c.events[0]
			c.events = append(c.events[:0], c.events[1:]...)
			more := len(c.events) > 0
			c.evMu.Unlock()
			if more {
				c.signalEvent()
			}
			return e, nil
		}
		c.evMu.Unlock()
		select {
		case <-c.evWake:
		case <-c.done:
			return verbs.AsyncEvent{}, errClosed("async event")
		case <-ctx.Done():
			return verbs.AsyncEvent{}, ctx.Err()
		}
	}
}

func (c *devContext) signalEvent() {
	select {
	case c.evWake <- struct{}{}:
	default:
	}
}

// event queues an asynchronous event about QP qpn (0 for none).
func (c *devContext) event(t verbs.AsyncEventType, qpn uint32) {
	c.queueEvent(verbs.AsyncEvent{Type: t, QPN: qpn})
}

// queueEvent queues ev, dropping the oldest when full. It never blocks,
// so callers may hold their own locks.
func (c *devContext) queueEvent(ev verbs.AsyncEvent) {
	c.evMu.Lock()
	if len(c.events) == maxEvents {
		c.events = append(c.events[:0], c.events[1:]...)
	}
	c.events = append(c.events, ev)
	c.evMu.Unlock()
	c.signalEvent()
}

func (c *devContext) Close() error {
	return c.lt.Close(func() error {
		close(c.done)
		dev.release()
		return nil
	})
}

type pd struct {
	lt  verbs.Lifetime
	ctx *devContext
}

func (p *pd) Close() error {
	return p.lt.Close(func() error {
		p.ctx.lt.DropChild()
		return nil
	})
}

func (p *pd) CreateAH(dest verbs.Address) (verbs.AH, error) {
	if dest.GID.IsMulticast() {
		if dest.Port > 1 {
			return nil, fmt.Errorf("soft: create ah: %w: port %d (soft0 has only port 1)", verbs.ErrInvalid, dest.Port)
		}
		if err := p.lt.AddChild(); err != nil {
			return nil, errClosed("create ah")
		}
		return &ah{pd: p, local: true, mcast: true, group: dest.GID}, nil
	}
	peer, err := routeOf(dest)
	if err != nil {
		return nil, fmt.Errorf("soft: create ah: %w", err)
	}
	if err := p.lt.AddChild(); err != nil {
		return nil, errClosed("create ah")
	}
	return &ah{pd: p, peer: peer, local: dev.local(peer)}, nil
}

// ah is an address handle: where UD sends go. An AH to a multicast GID
// (mcast) names the group, whose members are in this process (mcast.go).
type ah struct {
	lt    verbs.Lifetime
	pd    *pd
	peer  netip.AddrPort
	local bool
	mcast bool
	group verbs.GID
}

func (a *ah) Close() error {
	return a.lt.Close(func() error {
		a.pd.lt.DropChild()
		return nil
	})
}

// InjectEvent queues ev on ctx, a soft device context, as if the device
// had reported it: for tests of what a consumer does with port and QP
// events, which the soft device never has of its own. It reports false
// for a context of another provider.
func InjectEvent(ctx verbs.Context, ev verbs.AsyncEvent) bool {
	c, ok := ctx.(*devContext)
	if ok {
		c.queueEvent(ev)
	}
	return ok
}
