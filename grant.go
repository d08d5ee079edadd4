package rdma

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// ErrRegionRefused means the peer refused a RequestRegion.
var ErrRegionRefused = rc.ErrRegionRefused

// RegionOption configures one RequestRegion.
type RegionOption func(*regionRequest) error

type regionRequest struct {
	life time.Duration
}

// RegionLifetime asks for a region that lives at most d. The peer may
// shorten it to its own WithRegionLifetime; when it ends the peer
// revokes the region (Conn.Revoke), and accesses to it from this side
// fail with ErrRegionRevoked.
func RegionLifetime(d time.Duration) RegionOption {
	return func(r *regionRequest) error {
		if d <= 0 || d > math.MaxUint32*time.Millisecond {
			return fmt.Errorf("rdma: %w: region lifetime %v (want 1 ms..49 days)", ErrInvalid, d)
		}
		r.life = d
		return nil
	}
}

// RequestRegion asks the peer to allocate size bytes, zeroed, and expose
// them to us with access. The peer decides (see WithRegionLimit); a
// refusal gives an error wrapping ErrRegionRefused. The region lives
// until ReleaseRegion, the end of its lifetime (the peer's
// WithRegionLifetime, or shorter with RegionLifetime) or the end of the
// connection. Like a region of Expose, it is not bound to this
// connection: whoever holds its address and rkey on any connection of
// the granting engine can reach it too.
//
// At most 16 requests of one connection are in flight at once; more
// wait for an answer to come back. When ctx ends first RequestRegion
// returns ctx.Err(), and a grant that comes later is handed back to the
// peer.
func (c *Conn) RequestRegion(ctx context.Context, size int, access Access, opts ...RegionOption) (RemoteRegion, error) {
	if err := c.refuseOnTCP("request region"); err != nil {
		return RemoteRegion{}, err
	}
	var rr regionRequest
	for _, o := range opts {
		if err := o(&rr); err != nil {
			return RemoteRegion{}, err
		}
	}
	r, err := c.rc.Regions.Request(ctx, size, verbs.Access(access), rr.life)
	return RemoteRegion(r), err
}

// ReleaseRegion hands back a region the peer granted to RequestRegion.
// No access to r is posted after it starts (those fail with
// ErrRegionRevoked); it waits, until ctx ends, for the accesses in
// flight to complete and then tells the peer, which frees the memory.
func (c *Conn) ReleaseRegion(ctx context.Context, r RemoteRegion) error {
	if err := c.refuseOnTCP("release region"); err != nil {
		return err
	}
	return c.rc.Regions.Release(ctx, rc.Region(r))
}
