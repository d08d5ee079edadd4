package ud

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// DefaultMaxPeers bounds an endpoint's peer cache. A peer costs its entry
// (about 360 bytes of heap with its Addr and map slots, measured) and,
// once written to, an address handle: on a device a kernel object and a
// few hundred bytes of driver memory. Past the bound the peer written to or heard from longest
// ago is evicted; writing to it again asks its side channel again, and
// its datagrams read as from a sender known by route only.
const DefaultMaxPeers = 1024

// peer is one entry of the cache: a peer's address and route, and its
// address handle once a datagram was written to it.
type peer struct {
	addr    *Addr // what ReadFrom reports for it
	route   Route
	ah      *ahRef // nil until the first write; under peers.mu
	elem    *list.Element
	learned time.Time // when its route was last announced; under peers.mu
}

// ahRef is an address handle with a count of its users: the cache entry
// and each send posted through it. The handle closes when the last
// lets go, so an evicted peer's handle outlives its sends in flight.
type ahRef struct {
	ah   verbs.AH
	refs atomic.Int32
}

func (r *ahRef) acquire() { r.refs.Add(1) }

func (r *ahRef) release() {
	if r.refs.Add(-1) == 0 {
		r.ah.Close()
	}
}

// peers is the bounded cache of peers, by address and by route, with the
// least recently used first out.
type peers struct {
	mu      sync.Mutex
	max     int
	lru     list.List // *peer, most recent first
	byAddr  map[netip.AddrPort]*peer
	byRoute map[routeKey]*peer
	mkAH    func(Route) (verbs.AH, error)
	wrap    func(*Addr) net.Addr // nil: none
	evicted uint64               // under mu
}

func newPeers(max int, mkAH func(Route) (verbs.AH, error), wrap func(*Addr) net.Addr) *peers {
	return &peers{max: max, byAddr: map[netip.AddrPort]*peer{}, byRoute: map[routeKey]*peer{}, mkAH: mkAH, wrap: wrap}
}

// newAddr is the address of a peer at ap with route r, wrapped.
func (c *peers) newAddr(ap netip.AddrPort, r Route) *Addr {
	a := &Addr{ap: ap, route: r}
	if c.wrap != nil {
		a.ext = c.wrap(a)
	}
	return a
}

// learn records that ap (port 0: unknown) has route r, replacing what the
// cache held for either, and returns the entry.
func (c *peers) learn(ap netip.AddrPort, r Route) *peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.byRoute[r.key()]; p != nil && p.addr.ap == ap && p.route == r {
		c.lru.MoveToFront(p.elem)
		p.learned = time.Now()
		return p
	}
	if ap.Port() != 0 {
		if p := c.byAddr[ap]; p != nil {
			c.removeLocked(p)
		}
	}
	if p := c.byRoute[r.key()]; p != nil {
		c.removeLocked(p)
	}
	p := &peer{addr: c.newAddr(ap, r), route: r, learned: time.Now()}
	p.elem = c.lru.PushFront(p)
	if ap.Port() != 0 {
		c.byAddr[ap] = p
	}
	c.byRoute[r.key()] = p
	for c.lru.Len() > c.max {
		c.removeLocked(c.lru.Back().Value.(*peer))
		c.evicted++
	}
	return p
}

// byAddrPort is the peer at ap, or nil, and whether its route was
// announced longer than maxAge ago.
func (c *peers) byAddrPort(ap netip.AddrPort, maxAge time.Duration) (*peer, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.byAddr[ap]
	if p == nil {
		return nil, false
	}
	c.lru.MoveToFront(p.elem)
	return p, time.Since(p.learned) > maxAge
}

// from is the peer a datagram from route k came from, or nil.
func (c *peers) from(k routeKey) *peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.byRoute[k]
	if p != nil {
		c.lru.MoveToFront(p.elem)
	}
	return p
}

// ah is p's address handle with a reference for the caller's send, made
// on first use. p may have been evicted since it was looked up: its
// handle is then made for this send alone.
func (c *peers) ah(p *peer) (*ahRef, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.ah == nil {
		ah, err := c.mkAH(p.route)
		if err != nil {
			return nil, err
		}
		r := &ahRef{ah: ah}
		if p.elem == nil { // evicted: the handle is the send's alone
			r.refs.Store(1)
			return r, nil
		}
		r.refs.Store(1) // the cache's
		p.ah = r
	}
	p.ah.acquire()
	return p.ah, nil
}

// removeLocked drops p from the cache; its handle closes once no send
// holds it.
func (c *peers) removeLocked(p *peer) {
	c.lru.Remove(p.elem)
	p.elem = nil
	if c.byAddr[p.addr.ap] == p {
		delete(c.byAddr, p.addr.ap)
	}
	if c.byRoute[p.route.key()] == p {
		delete(c.byRoute, p.route.key())
	}
	if p.ah != nil {
		p.ah.release()
		p.ah = nil
	}
}

// clear drops every peer.
func (c *peers) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.lru.Len() > 0 {
		c.removeLocked(c.lru.Front().Value.(*peer))
	}
}
