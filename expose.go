package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// errNoControl: regions travel on the TCP control channel, which
// connections set up by rdma_cm do not have.
var errNoControl = fmt.Errorf("rdma: %w: region exchange needs a connection set up by go-rdma's handshake, not rdma_cm", ErrNotSupported)

// ErrRegionRevoked means the region's owner revoked it (or its lifetime
// ended): this side posts no access to it any more.
var ErrRegionRevoked = rc.ErrRegionRevoked

// exposure is memory of ours that the peer may reach.
type exposure struct {
	mr      verbs.MR
	pb      *pool.Buffer
	granted int         // bytes, when made for the peer's RequestRegion
	expiry  *time.Timer // a grant's lifetime; nil for Expose
	revoke  *revocation // set once an orderly revoke started
}

// revocation is an orderly revoke waiting for the peer's answer.
type revocation struct {
	done  chan struct{} // closed when the memory is deregistered
	err   error         // why, if the peer did not answer
	bound *time.Timer
}

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
	pb, off, n, err := local(b)
	if err != nil {
		return RemoteRegion{}, err
	}
	if pb.Pool() != c.eng.Pool {
		return RemoteRegion{}, fmt.Errorf("rdma: expose: %w: buffer from another connection's pool", ErrInvalid)
	}
	r, err := c.expose(pb, off, n, access, 0, 0)
	runtime.KeepAlive(b) // expose took the reference: the handle may go now
	return r, err
}

// expose registers n bytes of pb at off for the peer. A grant (granted >
// 0) owns pb outright and ends after life (0: never).
func (c *conn) expose(pb *pool.Buffer, off, n int, access Access, granted int, life time.Duration) (RemoteRegion, error) {
	if access == 0 || access&^(RemoteRead|RemoteWrite|RemoteAtomic) != 0 {
		return RemoteRegion{}, fmt.Errorf("rdma: expose with access %v: %w: want RemoteRead, RemoteWrite and/or RemoteAtomic", access, ErrInvalid)
	}
	if n == 0 {
		return RemoteRegion{}, fmt.Errorf("rdma: expose 0 bytes: %w", ErrInvalid)
	}
	if c.life.Err() != nil {
		return RemoteRegion{}, c.life.ClosedErr()
	}
	if err := pb.Ref(); err != nil {
		return RemoteRegion{}, fmt.Errorf("rdma: expose: %w", err)
	}
	acc := verbs.Access(access) // the same bits (Access)
	if access&(RemoteWrite|RemoteAtomic) != 0 {
		acc |= verbs.AccessLocalWrite
	}
	mem := pb.Bytes()[off : off+n]
	mr, err := c.eng.PD.RegMR(mem, acc)
	if err != nil {
		pb.Unref()
		return RemoteRegion{}, fmt.Errorf("rdma: expose %d bytes: %w", n, err)
	}
	r := RemoteRegion{Addr: mr.Addr(), Len: n, RKey: mr.RKey()}
	x := &exposure{mr: mr, pb: pb, granted: granted}
	c.rg.emu.Lock()
	if c.life.Closing() {
		c.rg.emu.Unlock()
		mr.Close()
		pb.Unref()
		return RemoteRegion{}, c.life.ClosedErr()
	}
	c.rg.exposed[r.RKey] = x
	if life > 0 {
		x.expiry = time.AfterFunc(life, func() { c.api.Revoke(context.Background(), r) })
	}
	c.rg.emu.Unlock()
	return r, nil
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
	if c.ctl.Conn() == nil {
		return c.api.RevokeNow(r)
	}
	c.rg.emu.Lock()
	x, ok := c.rg.exposed[r.RKey]
	if !ok {
		c.rg.emu.Unlock()
		return fmt.Errorf("rdma: revoke %v: %w: not exposed on this connection", r, ErrInvalid)
	}
	if x.revoke != nil { // under way already: wait for it
		rv := x.revoke
		c.rg.emu.Unlock()
		return c.waitRevoke(ctx, rv)
	}
	rv := &revocation{done: make(chan struct{})}
	x.revoke = rv
	if x.expiry != nil {
		x.expiry.Stop()
	}
	c.rg.emu.Unlock()

	select {
	case c.rg.revokeSlots <- struct{}{}:
	case <-c.ctx.Done():
		// The connection failed: no access of the peer's can come.
		c.finishRevoke(r.RKey, nil)
		return c.waitRevoke(ctx, rv)
	case <-ctx.Done():
		// Not asked yet: give the turn up and revoke at once would
		// break the peer; wait for a slot in the background instead.
		go func() {
			select {
			case c.rg.revokeSlots <- struct{}{}:
				c.askRevoke(r.RKey, rv)
			case <-c.ctx.Done():
				c.finishRevoke(r.RKey, nil)
			}
		}()
		return ctx.Err()
	}
	c.askRevoke(r.RKey, rv)
	return c.waitRevoke(ctx, rv)
}

// askRevoke sends the revoke and arms its bound. The caller holds a
// revoke slot, which finishRevoke gives back.
func (c *conn) askRevoke(rkey uint32, rv *revocation) {
	c.rg.emu.Lock()
	rv.bound = time.AfterFunc(revokeBound, func() {
		err := fmt.Errorf("rdma: peer %v did not answer the revoke of rkey %#x within %v: %w: cut off", c.remote, rkey, revokeBound, ErrProtocol)
		c.cutOff(err)
		c.finishRevoke(rkey, err)
	})
	c.rg.emu.Unlock()
	if err := c.ctl.Write(rc.CtrlRevoke, binary.BigEndian.AppendUint32(nil, rkey)); err != nil {
		// The connection failed: no access of the peer's can come.
		c.finishRevoke(rkey, nil)
	}
}

func (c *conn) waitRevoke(ctx context.Context, rv *revocation) error {
	select {
	case <-rv.done:
		return rv.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// onRevoked: the peer answered our revoke; nothing of its reaches the
// region any more.
func (c *conn) onRevoked(rkey uint32) {
	c.rg.emu.Lock()
	x, ok := c.rg.exposed[rkey]
	asked := ok && x.revoke != nil && x.revoke.bound != nil
	c.rg.emu.Unlock()
	if !asked {
		c.protocolErr("answered a revoke of rkey %#x that was not asked", rkey)
		return
	}
	c.finishRevoke(rkey, nil)
}

// finishRevoke deregisters an exposure whose revoke may complete: the
// peer answered, or can no longer reach it. It runs once per exposure.
func (c *conn) finishRevoke(rkey uint32, err error) {
	c.rg.emu.Lock()
	x, ok := c.rg.exposed[rkey]
	if !ok || x.revoke == nil {
		c.rg.emu.Unlock()
		return
	}
	delete(c.rg.exposed, rkey)
	c.rg.granted -= x.granted
	if x.granted > 0 {
		c.rg.grants--
	}
	rv := x.revoke
	asked := rv.bound != nil
	if asked {
		rv.bound.Stop()
	}
	c.rg.emu.Unlock()
	rv.err = errors.Join(err, c.unexpose(x))
	if asked {
		<-c.rg.revokeSlots
	}
	close(rv.done)
}

// unexpose deregisters x and returns its memory.
func (c *conn) unexpose(x *exposure) error {
	if x.expiry != nil {
		x.expiry.Stop()
	}
	err := x.mr.Close()
	x.pb.Unref()
	if x.granted > 0 {
		x.pb.Release() // granted memory is ours alone
	}
	return err
}

// RevokeNow ends an exposure at once, for emergencies: the memory is
// deregistered before the peer hears of it, so an access the peer has in
// flight, or posts next, fails with a remote access error, and that
// breaks the peer's connection (and so this one). The memory itself is
// safe: it stays out of the pool until the deregistration is done. Use
// Revoke to end an exposure without breaking the connection.
func (c *Conn) RevokeNow(r RemoteRegion) error {
	c.rg.emu.Lock()
	x, ok := c.rg.exposed[r.RKey]
	if ok && x.revoke != nil {
		// An orderly revoke is under way: finish it now.
		c.rg.emu.Unlock()
		c.finishRevoke(r.RKey, nil)
		return nil
	}
	if ok {
		delete(c.rg.exposed, r.RKey)
		c.rg.granted -= x.granted
		if x.granted > 0 {
			c.rg.grants--
		}
	}
	c.rg.emu.Unlock()
	if !ok {
		return fmt.Errorf("rdma: revoke %v: %w: not exposed on this connection", r, ErrInvalid)
	}
	return c.unexpose(x)
}

// onRevoke: the peer revokes one of its regions. New accesses to it fail
// from now on; the answer goes out once the accesses in flight are done
// (fence). A peer may have at most maxRevokes revokes unanswered.
func (c *conn) onRevoke(rkey uint32) {
	c.sq.Revoke(rkey)
	c.rg.emu.Lock()
	if len(c.rg.revokeAcks) >= maxRevokes {
		c.rg.emu.Unlock()
		c.protocolErr("more than %d revokes unanswered", maxRevokes)
		return
	}
	c.rg.revokeAcks = append(c.rg.revokeAcks, rkey)
	start := !c.rg.fencing
	c.rg.fencing = true
	c.rg.emu.Unlock()
	if start {
		c.ctl.Later(c.fence)
	}
}

// fence waits (bounded by revokeBound) until every WR issued before it
// has completed, then answers the revokes that were waiting for it.
func (c *conn) fence() {
	ctx, cancel := context.WithTimeout(c.ctx, revokeBound)
	err := c.sq.WaitSent(ctx)
	cancel()
	c.rg.emu.Lock()
	acks := c.rg.revokeAcks
	c.rg.revokeAcks = nil
	c.rg.fencing = false
	c.rg.emu.Unlock()
	if err != nil {
		return // failed or closing: the peer learns that from the connection
	}
	for _, rkey := range acks {
		if c.ctl.Write(rc.CtrlRevoked, binary.BigEndian.AppendUint32(nil, rkey)) != nil {
			return
		}
	}
}
