package rdma

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Access is a set of rights a peer gets on exposed memory (Expose,
// RequestRegion): RemoteRead, RemoteWrite and RemoteAtomic, or'd
// together. The empty set grants nothing and both refuse it. The bits
// are the verbs access flags, which RequestRegion sends on the wire.
type Access uint32

// Remote access rights for Expose and RequestRegion.
const (
	RemoteRead   Access = 1 << 2 // the peer may Read the region
	RemoteWrite  Access = 1 << 1 // the peer may Write to the region
	RemoteAtomic Access = 1 << 3 // the peer may CompareAndSwap and FetchAndAdd on the region
)

// String names the rights as the verbs flags do, e.g.
// "REMOTE_WRITE|REMOTE_READ", and the empty set "none".
func (a Access) String() string { return verbs.Access(a).String() }

// RemoteRegion names memory in the peer: Len bytes at the peer's virtual
// address Addr, reachable with RKey. An rkey is not a secret: whoever has
// the region can use it for as long as it is exposed.
type RemoteRegion struct {
	Addr uint64
	Len  int
	RKey uint32
}

// regionSize is the size of a marshaled RemoteRegion.
const regionSize = 8 + 8 + 4

// MarshalBinary encodes r in 20 bytes, big-endian.
func (r RemoteRegion) MarshalBinary() ([]byte, error) {
	return r.appendTo(make([]byte, 0, regionSize)), nil
}

func (r RemoteRegion) appendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Addr)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Len))
	return binary.BigEndian.AppendUint32(b, r.RKey)
}

// UnmarshalBinary decodes what MarshalBinary encoded.
func (r *RemoteRegion) UnmarshalBinary(b []byte) error {
	if len(b) != regionSize {
		return fmt.Errorf("rdma: remote region: %d bytes, want %d", len(b), regionSize)
	}
	n := binary.BigEndian.Uint64(b[8:])
	if n > 1<<48 {
		return fmt.Errorf("rdma: remote region: length %d out of range", n)
	}
	r.Addr = binary.BigEndian.Uint64(b)
	r.Len = int(n)
	r.RKey = binary.BigEndian.Uint32(b[16:])
	return nil
}

// Slice is the sub-region of n bytes at offset off.
func (r RemoteRegion) Slice(off, n int) (RemoteRegion, error) {
	if off < 0 || n < 0 || off > r.Len || n > r.Len-off {
		return RemoteRegion{}, fmt.Errorf("rdma: slice [%d:+%d] of a %d-byte remote region: %w", off, n, r.Len, ErrInvalid)
	}
	return RemoteRegion{Addr: r.Addr + uint64(off), Len: n, RKey: r.RKey}, nil
}

// String shows the region's address, length and rkey.
func (r RemoteRegion) String() string {
	return fmt.Sprintf("remote[%#x+%d rkey %#x]", r.Addr, r.Len, r.RKey)
}

// SendRegion hands r to the peer, whose RecvRegion returns it. At most
// 16 regions may wait for the peer's RecvRegion at once; past that
// SendRegion waits, until ctx ends, for the peer to take one.
//
// Sending a region to one peer does not keep it from the others: its
// rkey works from every connection of the engine that exposed it (see
// Expose), so a peer of another connection that learns or guesses it can
// use it too.
func (c *Conn) SendRegion(ctx context.Context, r RemoteRegion) error {
	if c.ctl.Conn() == nil {
		return errNoControl
	}
	select {
	case c.rg.regionSlots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return c.life.ClosedErr()
	}
	if err := c.control(ctx, rc.CtrlRegion, r.appendTo(nil)); err != nil {
		<-c.rg.regionSlots
		return err
	}
	return nil
}

// RecvRegion waits for a region the peer sends with SendRegion.
func (c *Conn) RecvRegion(ctx context.Context) (RemoteRegion, error) {
	if c.ctl.Conn() == nil {
		return RemoteRegion{}, errNoControl
	}
	var r RemoteRegion
	select {
	case r = <-c.rg.regions:
	case <-ctx.Done():
		return RemoteRegion{}, ctx.Err()
	case <-c.ctx.Done():
		select {
		case r = <-c.rg.regions: // sent before the end: still ours
		default:
			return RemoteRegion{}, c.life.ClosedErr()
		}
	}
	// The peer may send another; a failed write has failed the
	// connection, and the region is still good to return.
	c.ctl.Write(rc.CtrlTaken, nil)
	return r, nil
}

// onRegion queues a region the peer sent. The peer has a credit for
// each (see SendRegion), so a full queue means it sent past them.
func (c *conn) onRegion(p []byte) {
	var r RemoteRegion
	if err := r.UnmarshalBinary(p); err != nil {
		c.protocolErr("malformed region: %v", err)
		return
	}
	c.sq.ForgetRevoked(r.RKey)
	select {
	case c.rg.regions <- r:
	default:
		c.protocolErr("sent more than %d regions that RecvRegion did not take", maxQueuedRegions)
	}
}

// regionState is a connection's regions: those it exposed, granted and
// requested, and the peer's revocations it fences (Expose, SendRegion,
// RequestRegion, Revoke). Conn holds it as c.rg. The maps and counts are
// under emu; the channels bound what is in flight.
type regionState struct {
	emu         sync.Mutex
	exposed     map[uint32]*exposure
	granted     int // bytes granted to the peer's RequestRegion
	grants      int // regions granted to it
	requests    map[uint32]*request
	nextReq     uint32
	peerReqs    int               // the peer's region requests queued or being served
	revokeAcks  []uint32          // the peer's revokes waiting for a fence
	fencing     bool              // a fence is queued or running
	reqSlots    chan struct{}     // our RequestRegions in flight
	regionSlots chan struct{}     // our SendRegions the peer has not taken
	revokeSlots chan struct{}     // our orderly revokes in flight
	regions     chan RemoteRegion // the peer's SendRegions not taken yet
}

func newRegionState() regionState {
	return regionState{exposed: map[uint32]*exposure{}, requests: map[uint32]*request{},
		reqSlots: make(chan struct{}, maxRegionRequests), regionSlots: make(chan struct{}, maxQueuedRegions),
		revokeSlots: make(chan struct{}, maxRevokes), regions: make(chan RemoteRegion, maxQueuedRegions)}
}
