package rdma

import (
	"context"
	"fmt"

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

// MarshalBinary encodes r in 20 bytes, big-endian.
func (r RemoteRegion) MarshalBinary() ([]byte, error) {
	return rc.Region(r).AppendTo(make([]byte, 0, rc.RegionSize)), nil
}

// UnmarshalBinary decodes what MarshalBinary encoded.
func (r *RemoteRegion) UnmarshalBinary(b []byte) error {
	x, err := rc.ParseRegion(b)
	if err != nil {
		return err
	}
	*r = RemoteRegion(x)
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
func (r RemoteRegion) String() string { return rc.Region(r).String() }

// SendRegion hands r to the peer, whose RecvRegion returns it. At most
// 16 regions may wait for the peer's RecvRegion at once; past that
// SendRegion waits, until ctx ends, for the peer to take one.
//
// Sending a region to one peer does not keep it from the others: its
// rkey works from every connection of the engine that exposed it (see
// Expose), so a peer of another connection that learns or guesses it can
// use it too.
func (c *Conn) SendRegion(ctx context.Context, r RemoteRegion) error {
	if err := c.refuseOnTCP("send region"); err != nil {
		return err
	}
	return c.rc.Regions.Send(ctx, rc.Region(r))
}

// RecvRegion waits for a region the peer sends with SendRegion.
func (c *Conn) RecvRegion(ctx context.Context) (RemoteRegion, error) {
	if err := c.refuseOnTCP("recv region"); err != nil {
		return RemoteRegion{}, err
	}
	r, err := c.rc.Regions.Recv(ctx)
	return RemoteRegion(r), err
}
