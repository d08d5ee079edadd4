package rc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Exposures: memory of this side's that the peer may reach, and their
// orderly revokes, which the peer answers once its accesses are done.

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

// remoteRights are the rights a peer may get on a region.
const remoteRights = verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic

// Expose registers n bytes of pb at off for the peer. A grant (granted >
// 0) owns pb outright and ends after life (0: never).
func (g *Regions) Expose(pb *pool.Buffer, off, n int, access verbs.Access, granted int, life time.Duration) (Region, error) {
	if access == 0 || access&^remoteRights != 0 {
		return Region{}, fmt.Errorf("rdma: expose with access %v: %w: want RemoteRead, RemoteWrite and/or RemoteAtomic", access, verbs.ErrInvalid)
	}
	if n == 0 {
		return Region{}, fmt.Errorf("rdma: expose 0 bytes: %w", verbs.ErrInvalid)
	}
	if g.life.Err() != nil {
		return Region{}, g.life.ClosedErr()
	}
	if err := pb.Ref(); err != nil {
		return Region{}, fmt.Errorf("rdma: expose: %w", err)
	}
	acc := access
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 {
		acc |= verbs.AccessLocalWrite
	}
	mem := pb.Bytes()[off : off+n]
	mr, err := g.pd.RegMR(mem, acc)
	if err != nil {
		pb.Unref()
		return Region{}, fmt.Errorf("rdma: expose %d bytes: %w", n, err)
	}
	r := Region{Addr: mr.Addr(), Len: n, RKey: mr.RKey()}
	x := &exposure{mr: mr, pb: pb, granted: granted}
	g.emu.Lock()
	if g.life.Closing() {
		g.emu.Unlock()
		mr.Close()
		pb.Unref()
		return Region{}, g.life.ClosedErr()
	}
	g.exposed[r.RKey] = x
	if life > 0 {
		x.expiry = time.AfterFunc(life, func() { g.Revoke(context.Background(), r) })
	}
	g.emu.Unlock()
	return r, nil
}

// Revoke ends an exposure in order (rdma's Conn.Revoke): the peer is
// told, answers once its accesses are done, and then the memory is
// deregistered; without a control channel it is RevokeNow.
func (g *Regions) Revoke(ctx context.Context, r Region) error {
	if g.ctl.Conn() == nil {
		return g.RevokeNow(r)
	}
	g.emu.Lock()
	x, ok := g.exposed[r.RKey]
	if !ok {
		g.emu.Unlock()
		return fmt.Errorf("rdma: revoke %v: %w: not exposed on this connection", r, verbs.ErrInvalid)
	}
	if x.revoke != nil { // under way already: wait for it
		rv := x.revoke
		g.emu.Unlock()
		return g.waitRevoke(ctx, rv)
	}
	rv := &revocation{done: make(chan struct{})}
	x.revoke = rv
	if x.expiry != nil {
		x.expiry.Stop()
	}
	g.emu.Unlock()

	select {
	case g.revokeSlots <- struct{}{}:
	case <-g.ctx.Done():
		// The connection failed: no access of the peer's can come.
		g.finishRevoke(r.RKey, nil)
		return g.waitRevoke(ctx, rv)
	case <-ctx.Done():
		// Not asked yet: give the turn up and revoke at once would
		// break the peer; wait for a slot in the background instead.
		go func() {
			select {
			case g.revokeSlots <- struct{}{}:
				g.askRevoke(r.RKey, rv)
			case <-g.ctx.Done():
				g.finishRevoke(r.RKey, nil)
			}
		}()
		return ctx.Err()
	}
	g.askRevoke(r.RKey, rv)
	return g.waitRevoke(ctx, rv)
}

// askRevoke sends the revoke and arms its bound. The caller holds a
// revoke slot, which finishRevoke gives back.
func (g *Regions) askRevoke(rkey uint32, rv *revocation) {
	g.emu.Lock()
	rv.bound = time.AfterFunc(RevokeBound, func() {
		err := fmt.Errorf("rdma: peer %v did not answer the revoke of rkey %#x within %v: %w: cut off", g.life.remote, rkey, RevokeBound, ErrProtocol)
		g.owner.CutOff(err)
		g.finishRevoke(rkey, err)
	})
	g.emu.Unlock()
	if err := g.ctl.Write(CtrlRevoke, binary.BigEndian.AppendUint32(nil, rkey)); err != nil {
		// The connection failed: no access of the peer's can come.
		g.finishRevoke(rkey, nil)
	}
}

func (g *Regions) waitRevoke(ctx context.Context, rv *revocation) error {
	select {
	case <-rv.done:
		return rv.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// onRevoked: the peer answered our revoke; nothing of its reaches the
// region any more.
func (g *Regions) OnRevoked(rkey uint32) {
	g.emu.Lock()
	x, ok := g.exposed[rkey]
	asked := ok && x.revoke != nil && x.revoke.bound != nil
	g.emu.Unlock()
	if !asked {
		g.owner.ProtocolErr("answered a revoke of rkey %#x that was not asked", rkey)
		return
	}
	g.finishRevoke(rkey, nil)
}

// finishRevoke deregisters an exposure whose revoke may complete: the
// peer answered, or can no longer reach it. It runs once per exposure.
func (g *Regions) finishRevoke(rkey uint32, err error) {
	g.emu.Lock()
	x, ok := g.exposed[rkey]
	if !ok || x.revoke == nil {
		g.emu.Unlock()
		return
	}
	delete(g.exposed, rkey)
	g.granted -= x.granted
	if x.granted > 0 {
		g.grants--
	}
	rv := x.revoke
	asked := rv.bound != nil
	if asked {
		rv.bound.Stop()
	}
	g.emu.Unlock()
	rv.err = errors.Join(err, g.unexpose(x))
	if asked {
		<-g.revokeSlots
	}
	close(rv.done)
}

// unexpose deregisters x and returns its memory.
func (g *Regions) unexpose(x *exposure) error {
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

// RevokeNow ends an exposure at once (rdma's Conn.RevokeNow), finishing
// an orderly revoke under way.
func (g *Regions) RevokeNow(r Region) error {
	g.emu.Lock()
	x, ok := g.exposed[r.RKey]
	if ok && x.revoke != nil {
		// An orderly revoke is under way: finish it now.
		g.emu.Unlock()
		g.finishRevoke(r.RKey, nil)
		return nil
	}
	if ok {
		delete(g.exposed, r.RKey)
		g.granted -= x.granted
		if x.granted > 0 {
			g.grants--
		}
	}
	g.emu.Unlock()
	if !ok {
		return fmt.Errorf("rdma: revoke %v: %w: not exposed on this connection", r, verbs.ErrInvalid)
	}
	return g.unexpose(x)
}

// onRevoke: the peer revokes one of its regions. New accesses to it fail
// from now on; the answer goes out once the accesses in flight are done
// (fence). A peer may have at most maxRevokes revokes unanswered.
func (g *Regions) OnRevoke(rkey uint32) {
	g.sq.Revoke(rkey)
	g.emu.Lock()
	if len(g.revokeAcks) >= maxRevokes {
		g.emu.Unlock()
		g.owner.ProtocolErr("more than %d revokes unanswered", maxRevokes)
		return
	}
	g.revokeAcks = append(g.revokeAcks, rkey)
	start := !g.fencing
	g.fencing = true
	g.emu.Unlock()
	if start {
		g.ctl.Later(g.fence)
	}
}

// fence waits (bounded by RevokeBound) until every WR issued before it
// has completed, then answers the revokes that were waiting for it.
func (g *Regions) fence() {
	ctx, cancel := context.WithTimeout(g.ctx, RevokeBound)
	err := g.sq.WaitSent(ctx)
	cancel()
	g.emu.Lock()
	acks := g.revokeAcks
	g.revokeAcks = nil
	g.fencing = false
	g.emu.Unlock()
	if err != nil {
		return // failed or closing: the peer learns that from the connection
	}
	for _, rkey := range acks {
		if g.ctl.Write(CtrlRevoked, binary.BigEndian.AppendUint32(nil, rkey)) != nil {
			return
		}
	}
}

// RevokeAll ends every exposure at once, at the teardown: the QP is
// gone, so no access of the peer's can come.
func (g *Regions) RevokeAll() error {
	g.emu.Lock()
	keys := make([]uint32, 0, len(g.exposed))
	for k := range g.exposed {
		keys = append(keys, k)
	}
	g.emu.Unlock()
	var errs []error
	for _, k := range keys {
		if err := g.RevokeNow(Region{RKey: k}); err != nil && !errors.Is(err, verbs.ErrInvalid) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
