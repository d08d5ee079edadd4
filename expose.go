package rdma

import (
	"context"
	"fmt"
	"runtime"

	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The regions a connection exposes, grants and requests are rc.Regions
// (c.rg); these are their API.

// ErrRegionRevoked means the region's owner revoked it (or its lifetime
// ended): this side posts no access to it any more.
var ErrRegionRevoked = rc.ErrRegionRevoked

// Expose registers exactly the memory of b with exactly the rights in
// access (RemoteRead, RemoteWrite, RemoteAtomic) and returns the region
// to hand to the peer (with SendRegion, or by any other means). The
// exposure lasts until Revoke or until this connection closes.
//
// The region is not bound to this connection. Memory is registered in
// the engine's protection domain, and an rkey is valid on every queue
// pair of its protection domain (RDMA's rule), so any peer of any
// connection of this engine, dialed or accepted, that holds the region's
// address and rkey can access it with the rights in access. An rkey is
// not a secret: it is in every packet that uses it, and without WithTLS
// it crosses the control channel in clear. To keep peers apart, give each
// tenant an engine of its own (OpenEngine, and a listener on it: engines
// have separate protection domains), and expose as little as possible
// for as short as possible (Revoke ends the rkey for every connection).
func (c *Conn) Expose(b Local, access Access) (RemoteRegion, error) {
	if err := c.refuseOnTCP("expose"); err != nil {
		return RemoteRegion{}, err
	}
	pb, off, n, err := local(b)
	if err != nil {
		return RemoteRegion{}, err
	}
	if pb.Pool() != c.eng.Pool {
		return RemoteRegion{}, fmt.Errorf("rdma: expose: %w: buffer from another connection's pool", ErrInvalid)
	}
	r, err := c.rc.Regions.Expose(pb, off, n, verbs.Access(access), 0, 0)
	runtime.KeepAlive(b) // Expose took the reference: the handle may go now
	return RemoteRegion(r), err
}

// Revoke ends an exposure, made by Expose or for the peer's
// RequestRegion, in order: the peer is told, posts no new access to the
// region (those fail there with ErrRegionRevoked), and answers once the
// accesses it had in flight have completed; only then is the memory
// deregistered. A peer that does not answer within 5 s is cut off (the
// connection fails) and the memory is deregistered then. When ctx ends
// first Revoke returns ctx.Err() and the revoke goes on without it.
//
// At most 64 revokes of one connection are in flight at once; more wait
// for room. On connections set up through rdma_cm, which have no control
// channel to ask the peer, Revoke works as RevokeNow.
func (c *Conn) Revoke(ctx context.Context, r RemoteRegion) error {
	if err := c.refuseOnTCP("revoke"); err != nil {
		return err
	}
	return c.rc.Regions.Revoke(ctx, rc.Region(r))
}

// RevokeNow ends an exposure at once, for emergencies: the memory is
// deregistered before the peer hears of it, so an access the peer has in
// flight, or posts next, fails with a remote access error, and that
// breaks the peer's connection (and so this one). The memory itself is
// safe: it stays out of the pool until the deregistration is done. Use
// Revoke to end an exposure without breaking the connection.
func (c *Conn) RevokeNow(r RemoteRegion) error {
	if err := c.refuseOnTCP("revoke"); err != nil {
		return err
	}
	return c.rc.Regions.RevokeNow(rc.Region(r))
}
