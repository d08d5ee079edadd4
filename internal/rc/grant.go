package rc

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Grants of regions: the peer's RequestRegion, served from the pool and
// exposed for it, and this side's requests waiting for answers.

// request is one RequestRegion waiting for the peer's answer.
type request struct {
	ch        chan regionAnswer // buffered: the answer never waits
	abandoned bool              // the requester gave up: a grant goes back
}

type regionAnswer struct {
	r   Region
	err error
}

// Request asks the peer for a region of size bytes with access, living
// at most life (0: the peer's bound), and waits for its answer (rdma's
// Conn.RequestRegion). A grant that comes after ctx ended goes back.
func (g *Regions) Request(ctx context.Context, size int, access verbs.Access, life time.Duration) (Region, error) {
	if size <= 0 || access == 0 || access&^remoteRights != 0 {
		return Region{}, fmt.Errorf("rdma: request region of %d bytes, access %v: %w", size, access, verbs.ErrInvalid)
	}
	if g.ctl.Conn() == nil {
		return Region{}, ErrNoControl
	}
	select {
	case g.reqSlots <- struct{}{}:
	case <-ctx.Done():
		return Region{}, ctx.Err()
	case <-g.ctx.Done():
		return Region{}, g.life.ClosedErr()
	}
	ch := make(chan regionAnswer, 1)
	g.emu.Lock()
	if g.life.Err() != nil {
		g.emu.Unlock()
		<-g.reqSlots
		return Region{}, g.life.ClosedErr()
	}
	g.nextReq++
	id := g.nextReq
	g.requests[id] = &request{ch: ch}
	g.emu.Unlock()
	p := binary.BigEndian.AppendUint32(nil, id)
	p = binary.BigEndian.AppendUint64(p, uint64(size))
	p = binary.BigEndian.AppendUint32(p, uint32(access))
	p = binary.BigEndian.AppendUint32(p, uint32(life/time.Millisecond))
	if err := g.control(ctx, CtrlRequest, p); err != nil {
		g.emu.Lock()
		_, mine := g.requests[id]
		delete(g.requests, id)
		g.emu.Unlock()
		if mine {
			<-g.reqSlots
		}
		return Region{}, err
	}
	select {
	case a := <-ch:
		return a.r, a.err
	case <-ctx.Done():
		g.emu.Lock()
		rq, waiting := g.requests[id]
		if waiting {
			rq.abandoned = true // onAnswer hands a grant back
		}
		g.emu.Unlock()
		if !waiting {
			// The answer was taken as ctx ended: it is in ch, or
			// about to be. A grant goes back to the peer.
			if a := <-ch; a.err == nil {
				g.Release(context.Background(), a.r)
			}
		}
		return Region{}, ctx.Err()
	}
}

// Release hands back a region the peer granted (rdma's
// Conn.ReleaseRegion): no access to it is posted from now on, and the
// peer hears once those in flight are done.
func (g *Regions) Release(ctx context.Context, r Region) error {
	if g.ctl.Conn() == nil {
		return ErrNoControl
	}
	g.sq.Revoke(r.RKey)
	if err := g.sq.WaitSent(ctx); err != nil {
		if g.life.Err() != nil {
			return g.life.ClosedErr()
		}
		return err
	}
	return g.control(ctx, CtrlFree, binary.BigEndian.AppendUint32(nil, r.RKey))
}

// onRequest queues a peer's RequestRegion for the control worker. A
// peer may have MaxRegionRequests in flight.
func (g *Regions) OnRequest(p []byte) {
	if len(p) != 20 {
		g.owner.ProtocolErr("malformed region request")
		return
	}
	id, size := binary.BigEndian.Uint32(p), binary.BigEndian.Uint64(p[4:])
	access := verbs.Access(binary.BigEndian.Uint32(p[12:]))
	life := time.Duration(binary.BigEndian.Uint32(p[16:])) * time.Millisecond
	g.emu.Lock()
	if g.peerReqs >= MaxRegionRequests {
		g.emu.Unlock()
		g.owner.ProtocolErr("more than %d region requests in flight", MaxRegionRequests)
		return
	}
	g.peerReqs++
	g.emu.Unlock()
	g.ctl.Later(func() {
		typ, p := g.grant(size, access, life)
		// The request is served before the peer can hear it: it may
		// send its next one as soon as the answer arrives.
		g.emu.Lock()
		g.peerReqs--
		g.emu.Unlock()
		g.control(context.Background(), typ, append(binary.BigEndian.AppendUint32(nil, id), p...))
	})
}

// grant serves a peer's RequestRegion on the control worker and returns
// the answer.
func (g *Regions) grant(size uint64, access verbs.Access, life time.Duration) (typ byte, p []byte) {
	deny := func(why string) (byte, []byte) { return CtrlDeny, []byte(why) }
	if access == 0 || access&^remoteRights != 0 || size == 0 {
		return deny(fmt.Sprintf("bad request: %d bytes, access %v", size, access))
	}
	limit := g.limit
	g.emu.Lock()
	granted, grants := g.granted, g.grants
	ok := size <= uint64(limit-granted) && grants < maxGrants
	if ok {
		g.granted += int(size)
		g.grants++
	}
	g.emu.Unlock()
	switch {
	case grants >= maxGrants:
		return deny(fmt.Sprintf("%d regions granted already, the most a connection may hold", grants))
	case !ok:
		return deny(fmt.Sprintf("%d bytes would pass the peer's region limit of %d bytes (%d granted)", size, limit, granted))
	}
	if max := g.lifeMax; life == 0 || life > max {
		life = max
	}
	pb, err := g.pool.Get(int(size))
	if err == nil {
		var r Region
		if r, err = g.Expose(pb, 0, int(size), access, int(size), life); err == nil {
			return CtrlGrant, r.AppendTo(nil)
		}
		pb.Release()
	}
	g.emu.Lock()
	g.granted -= int(size)
	g.grants--
	g.emu.Unlock()
	return deny(err.Error())
}

// onAnswer hands a grant or denial to the waiting RequestRegion; a grant
// nobody waits for any more is handed back.
func (g *Regions) OnAnswer(typ byte, p []byte) {
	if len(p) < 4 {
		g.owner.ProtocolErr("malformed region answer")
		return
	}
	id := binary.BigEndian.Uint32(p)
	var a regionAnswer
	if typ == CtrlGrant {
		var err error
		if a.r, err = ParseRegion(p[4:]); err != nil {
			g.owner.ProtocolErr("malformed grant: %v", err)
			return
		}
		g.sq.ForgetRevoked(a.r.RKey)
	} else {
		a.err = fmt.Errorf("rdma: peer %v: %w: %q", g.life.remote, ErrRegionRefused, p[4:])
	}
	g.emu.Lock()
	rq, ok := g.requests[id]
	delete(g.requests, id)
	g.emu.Unlock()
	if !ok {
		g.owner.ProtocolErr("answered region request %d, which is not in flight", id)
		return
	}
	<-g.reqSlots
	if !rq.abandoned {
		rq.ch <- a
		return
	}
	if typ == CtrlGrant {
		// Nobody can have posted an access to it: hand it back now.
		g.ctl.Write(CtrlFree, binary.BigEndian.AppendUint32(nil, a.r.RKey))
	}
}

// onFree: the peer hands back a region granted to it; it has no access
// in flight (ReleaseRegion waits for them). Only a grant can be handed
// back: memory this side exposed with Expose stays until its Revoke. A
// release of a region that is gone already (it expired) is no error.
func (g *Regions) OnFree(rkey uint32) {
	g.emu.Lock()
	x, ok := g.exposed[rkey]
	grant := ok && x.granted > 0
	g.emu.Unlock()
	if grant {
		g.RevokeNow(Region{RKey: rkey})
	}
}

// failRequests answers every RequestRegion in flight with err.
func (g *Regions) FailRequests(err error) {
	g.emu.Lock()
	for id, rq := range g.requests {
		delete(g.requests, id)
		<-g.reqSlots
		rq.ch <- regionAnswer{err: err}
	}
	g.emu.Unlock()
}
