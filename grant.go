package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-rdma/rdma/internal/rc"
)

// ErrRegionRefused means the peer refused a RequestRegion.
var ErrRegionRefused = errors.New("peer refused the region request")

// request is one RequestRegion waiting for the peer's answer.
type request struct {
	ch        chan regionAnswer // buffered: the answer never waits
	abandoned bool              // the requester gave up: a grant goes back
}

type regionAnswer struct {
	r   RemoteRegion
	err error
}

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
	if size <= 0 || access == 0 || access&^(RemoteRead|RemoteWrite|RemoteAtomic) != 0 {
		return RemoteRegion{}, fmt.Errorf("rdma: request region of %d bytes, access %v: %w", size, access, ErrInvalid)
	}
	var rr regionRequest
	for _, o := range opts {
		if err := o(&rr); err != nil {
			return RemoteRegion{}, err
		}
	}
	if c.ctl.Conn() == nil {
		return RemoteRegion{}, errNoControl
	}
	select {
	case c.rg.reqSlots <- struct{}{}:
	case <-ctx.Done():
		return RemoteRegion{}, ctx.Err()
	case <-c.ctx.Done():
		return RemoteRegion{}, c.life.ClosedErr()
	}
	ch := make(chan regionAnswer, 1)
	c.rg.emu.Lock()
	if c.life.Err() != nil {
		c.rg.emu.Unlock()
		<-c.rg.reqSlots
		return RemoteRegion{}, c.life.ClosedErr()
	}
	c.rg.nextReq++
	id := c.rg.nextReq
	c.rg.requests[id] = &request{ch: ch}
	c.rg.emu.Unlock()
	p := binary.BigEndian.AppendUint32(nil, id)
	p = binary.BigEndian.AppendUint64(p, uint64(size))
	p = binary.BigEndian.AppendUint32(p, uint32(access))
	p = binary.BigEndian.AppendUint32(p, uint32(rr.life/time.Millisecond))
	if err := c.control(ctx, rc.CtrlRequest, p); err != nil {
		c.rg.emu.Lock()
		_, mine := c.rg.requests[id]
		delete(c.rg.requests, id)
		c.rg.emu.Unlock()
		if mine {
			<-c.rg.reqSlots
		}
		return RemoteRegion{}, err
	}
	select {
	case a := <-ch:
		return a.r, a.err
	case <-ctx.Done():
		c.rg.emu.Lock()
		rq, waiting := c.rg.requests[id]
		if waiting {
			rq.abandoned = true // onAnswer hands a grant back
		}
		c.rg.emu.Unlock()
		if !waiting {
			// The answer was taken as ctx ended: it is in ch, or
			// about to be. A grant goes back to the peer.
			if a := <-ch; a.err == nil {
				c.ReleaseRegion(context.Background(), a.r)
			}
		}
		return RemoteRegion{}, ctx.Err()
	}
}

// ReleaseRegion hands back a region the peer granted to RequestRegion.
// No access to r is posted after it starts (those fail with
// ErrRegionRevoked); it waits, until ctx ends, for the accesses in
// flight to complete and then tells the peer, which frees the memory.
func (c *Conn) ReleaseRegion(ctx context.Context, r RemoteRegion) error {
	if c.ctl.Conn() == nil {
		return errNoControl
	}
	c.sq.Revoke(r.RKey)
	if err := c.sq.WaitSent(ctx); err != nil {
		if c.life.Err() != nil {
			return c.life.ClosedErr()
		}
		return err
	}
	return c.control(ctx, rc.CtrlFree, binary.BigEndian.AppendUint32(nil, r.RKey))
}

// onRequest queues a peer's RequestRegion for the control worker. A
// peer may have maxRegionRequests in flight.
func (c *conn) onRequest(p []byte) {
	if len(p) != 20 {
		c.protocolErr("malformed region request")
		return
	}
	id, size := binary.BigEndian.Uint32(p), binary.BigEndian.Uint64(p[4:])
	access := Access(binary.BigEndian.Uint32(p[12:]))
	life := time.Duration(binary.BigEndian.Uint32(p[16:])) * time.Millisecond
	c.rg.emu.Lock()
	if c.rg.peerReqs >= maxRegionRequests {
		c.rg.emu.Unlock()
		c.protocolErr("more than %d region requests in flight", maxRegionRequests)
		return
	}
	c.rg.peerReqs++
	c.rg.emu.Unlock()
	c.ctl.Later(func() {
		typ, p := c.grant(size, access, life)
		// The request is served before the peer can hear it: it may
		// send its next one as soon as the answer arrives.
		c.rg.emu.Lock()
		c.rg.peerReqs--
		c.rg.emu.Unlock()
		c.control(context.Background(), typ, append(binary.BigEndian.AppendUint32(nil, id), p...))
	})
}

// grant serves a peer's RequestRegion on the control worker and returns
// the answer.
func (c *conn) grant(size uint64, access Access, life time.Duration) (typ byte, p []byte) {
	deny := func(why string) (byte, []byte) { return rc.CtrlDeny, []byte(why) }
	if access == 0 || access&^(RemoteRead|RemoteWrite|RemoteAtomic) != 0 || size == 0 {
		return deny(fmt.Sprintf("bad request: %d bytes, access %v", size, access))
	}
	limit := c.cfg.maxExpose
	c.rg.emu.Lock()
	granted, grants := c.rg.granted, c.rg.grants
	ok := size <= uint64(limit-granted) && grants < maxGrants
	if ok {
		c.rg.granted += int(size)
		c.rg.grants++
	}
	c.rg.emu.Unlock()
	switch {
	case grants >= maxGrants:
		return deny(fmt.Sprintf("%d regions granted already, the most a connection may hold", grants))
	case !ok:
		return deny(fmt.Sprintf("%d bytes would pass the peer's region limit of %d bytes (%d granted)", size, limit, granted))
	}
	if max := c.cfg.regionLife; life == 0 || life > max {
		life = max
	}
	pb, err := c.eng.Pool.Get(int(size))
	if err == nil {
		var r RemoteRegion
		if r, err = c.expose(pb, 0, int(size), access, int(size), life); err == nil {
			return rc.CtrlGrant, r.appendTo(nil)
		}
		pb.Release()
	}
	c.rg.emu.Lock()
	c.rg.granted -= int(size)
	c.rg.grants--
	c.rg.emu.Unlock()
	return deny(err.Error())
}

// onAnswer hands a grant or denial to the waiting RequestRegion; a grant
// nobody waits for any more is handed back.
func (c *conn) onAnswer(typ byte, p []byte) {
	if len(p) < 4 {
		c.protocolErr("malformed region answer")
		return
	}
	id := binary.BigEndian.Uint32(p)
	var a regionAnswer
	if typ == rc.CtrlGrant {
		if err := a.r.UnmarshalBinary(p[4:]); err != nil {
			c.protocolErr("malformed grant: %v", err)
			return
		}
		c.sq.ForgetRevoked(a.r.RKey)
	} else {
		a.err = fmt.Errorf("rdma: peer %v: %w: %q", c.remote, ErrRegionRefused, p[4:])
	}
	c.rg.emu.Lock()
	rq, ok := c.rg.requests[id]
	delete(c.rg.requests, id)
	c.rg.emu.Unlock()
	if !ok {
		c.protocolErr("answered region request %d, which is not in flight", id)
		return
	}
	<-c.rg.reqSlots
	if !rq.abandoned {
		rq.ch <- a
		return
	}
	if typ == rc.CtrlGrant {
		// Nobody can have posted an access to it: hand it back now.
		c.ctl.Write(rc.CtrlFree, binary.BigEndian.AppendUint32(nil, a.r.RKey))
	}
}

// onFree: the peer hands back a region granted to it; it has no access
// in flight (ReleaseRegion waits for them). Only a grant can be handed
// back: memory this side exposed with Expose stays until its Revoke. A
// release of a region that is gone already (it expired) is no error.
func (c *conn) onFree(rkey uint32) {
	c.rg.emu.Lock()
	x, ok := c.rg.exposed[rkey]
	grant := ok && x.granted > 0
	c.rg.emu.Unlock()
	if grant {
		c.api.RevokeNow(RemoteRegion{RKey: rkey})
	}
}

// failRequests answers every RequestRegion in flight with err.
func (c *conn) failRequests(err error) {
	c.rg.emu.Lock()
	for id, rq := range c.rg.requests {
		delete(c.rg.requests, id)
		<-c.rg.reqSlots
		rq.ch <- regionAnswer{err: err}
	}
	c.rg.emu.Unlock()
}
