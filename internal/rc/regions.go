package rc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Regions is a connection's regions: those it exposed, granted and
// requested, and the peer's revocations it fences (Expose, Send,
// Request, Revoke). The maps and counts are under emu; the channels
// bound what is in flight.
type Regions struct {
	emu         sync.Mutex
	exposed     map[uint32]*exposure
	granted     int // bytes granted to the peer's RequestRegion
	grants      int // regions granted to it
	requests    map[uint32]*request
	nextReq     uint32
	peerReqs    int           // the peer's region requests queued or being served
	revokeAcks  []uint32      // the peer's revokes waiting for a fence
	fencing     bool          // a fence is queued or running
	reqSlots    chan struct{} // our RequestRegions in flight
	regionSlots chan struct{} // our SendRegions the peer has not taken
	revokeSlots chan struct{} // our orderly revokes in flight
	regions     chan Region   // the peer's SendRegions not taken yet

	// The parts they work with, set by Init, read-only after.
	ctx     context.Context // the connection's: ends when it fails or closes
	life    *Life
	ctl     *Control
	sq      *SendQueue // refuses accesses to revoked regions; fences
	owner   Owner
	pool    *pool.Pool    // a grant's memory
	pd      verbs.PD      // where regions are registered
	limit   int           // bytes the peer may be granted (WithRegionLimit)
	lifeMax time.Duration // the longest a grant lives (WithRegionLifetime)
}

// What one peer may have outstanding on a connection's control channel.
// A well-behaved peer waits for room; a peer that sends past a bound is
// cut off (the connection fails with ErrProtocol), so the work and the
// memory a peer can cause are bounded per connection.
const (
	// MaxRegionRequests bounds the RequestRegion calls in flight per
	// connection; more wait for an answer to come back.
	MaxRegionRequests = 16
	// maxQueuedRegions bounds the regions SendRegion has sent and the
	// peer's RecvRegion has not taken yet; SendRegion waits for room.
	maxQueuedRegions = 16
	// maxGrants bounds the regions granted to the peer's RequestRegion
	// at once (on top of WithRegionLimit's bytes); past it requests are
	// refused.
	maxGrants = 64
	// maxRevokes bounds the orderly revokes in flight per connection;
	// Revoke waits for room.
	maxRevokes = 64
	// RevokeBound is how long a peer has to answer a revoke, and to
	// finish its operations when either side closes, before it is cut
	// off.
	RevokeBound = 5 * time.Second
)

// ErrRegionRefused: the peer refused a RequestRegion.
var ErrRegionRefused = errors.New("peer refused the region request")

// ErrNoControl: regions travel on the TCP control channel, which
// connections set up by rdma_cm do not have.
var ErrNoControl = fmt.Errorf("rdma: %w: region exchange needs a connection set up by go-rdma's handshake, not rdma_cm", verbs.ErrNotSupported)

// Init makes the regions of a connection: ctx is its context, life,
// ctl and sq its parts, owner the connection; grants come from pool,
// every region is registered on pd, and the peer may be granted limit
// bytes, for at most lifeMax each.
func (g *Regions) Init(ctx context.Context, life *Life, ctl *Control, sq *SendQueue, owner Owner, pool *pool.Pool, pd verbs.PD, limit int, lifeMax time.Duration) {
	g.exposed, g.requests = map[uint32]*exposure{}, map[uint32]*request{}
	g.reqSlots, g.regionSlots = make(chan struct{}, MaxRegionRequests), make(chan struct{}, maxQueuedRegions)
	g.revokeSlots, g.regions = make(chan struct{}, maxRevokes), make(chan Region, maxQueuedRegions)
	g.ctx, g.life, g.ctl, g.sq, g.owner, g.pool, g.pd, g.limit, g.lifeMax = ctx, life, ctl, sq, owner, pool, pd, limit, lifeMax
}

// Region names memory in the peer: Len bytes at the peer's virtual
// address Addr, reachable with RKey (rdma.RemoteRegion, which converts).
type Region struct {
	Addr uint64
	Len  int
	RKey uint32
}

// RegionSize is the size of a region on the wire.
const RegionSize = 8 + 8 + 4

// AppendTo appends r's wire form: 20 bytes, big-endian.
func (r Region) AppendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Addr)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Len))
	return binary.BigEndian.AppendUint32(b, r.RKey)
}

// ParseRegion decodes what AppendTo encoded.
func ParseRegion(b []byte) (Region, error) {
	if len(b) != RegionSize {
		return Region{}, fmt.Errorf("rdma: remote region: %d bytes, want %d", len(b), RegionSize)
	}
	n := binary.BigEndian.Uint64(b[8:])
	if n > 1<<48 {
		return Region{}, fmt.Errorf("rdma: remote region: length %d out of range", n)
	}
	return Region{Addr: binary.BigEndian.Uint64(b), Len: int(n), RKey: binary.BigEndian.Uint32(b[16:])}, nil
}

// String shows the region's address, length and rkey.
func (r Region) String() string {
	return fmt.Sprintf("remote[%#x+%d rkey %#x]", r.Addr, r.Len, r.RKey)
}

// control writes one control frame, bounded by ctx.
func (g *Regions) control(ctx context.Context, typ byte, p []byte) error {
	if g.ctl.Conn() == nil {
		return ErrNoControl
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if g.life.Err() != nil {
		return g.life.ClosedErr()
	}
	return g.ctl.Write(typ, p)
}

// Send hands r to the peer (rdma's Conn.SendRegion), waiting for room
// when the peer has not taken the regions sent before.
func (g *Regions) Send(ctx context.Context, r Region) error {
	if g.ctl.Conn() == nil {
		return ErrNoControl
	}
	select {
	case g.regionSlots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-g.ctx.Done():
		return g.life.ClosedErr()
	}
	if err := g.control(ctx, CtrlRegion, r.AppendTo(nil)); err != nil {
		<-g.regionSlots
		return err
	}
	return nil
}

// Recv waits for a region the peer sent (rdma's Conn.RecvRegion).
func (g *Regions) Recv(ctx context.Context) (Region, error) {
	if g.ctl.Conn() == nil {
		return Region{}, ErrNoControl
	}
	var r Region
	select {
	case r = <-g.regions:
	case <-ctx.Done():
		return Region{}, ctx.Err()
	case <-g.ctx.Done():
		select {
		case r = <-g.regions: // sent before the end: still ours
		default:
			return Region{}, g.life.ClosedErr()
		}
	}
	// The peer may send another; a failed write has failed the
	// connection, and the region is still good to return.
	g.ctl.Write(CtrlTaken, nil)
	return r, nil
}

// onRegion queues a region the peer sent. The peer has a credit for
// each (see SendRegion), so a full queue means it sent past them.
func (g *Regions) OnRegion(p []byte) {
	r, err := ParseRegion(p)
	if err != nil {
		g.owner.ProtocolErr("malformed region: %v", err)
		return
	}
	g.sq.ForgetRevoked(r.RKey)
	select {
	case g.regions <- r:
	default:
		g.owner.ProtocolErr("sent more than %d regions that RecvRegion did not take", maxQueuedRegions)
	}
}

// OnTaken: the peer's RecvRegion took a region this side sent, which
// makes room for the next.
func (g *Regions) OnTaken() {
	select {
	case <-g.regionSlots:
	default:
		g.owner.ProtocolErr("took a region that was never sent")
	}
}

// Counts reads the RequestRegion calls waiting for an answer, the bytes
// and regions granted to the peer, and the exposures (tests).
func (g *Regions) Counts() (requests, grantedBytes, grants, exposed int) {
	g.emu.Lock()
	defer g.emu.Unlock()
	return len(g.requests), g.granted, g.grants, len(g.exposed)
}
