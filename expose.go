package rdma

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
	"github.com/go-rdma/rdma/pool"
)

// errNoControl: regions travel on the TCP control channel, which
// connections set up by rdma_cm do not have.
var errNoControl = fmt.Errorf("rdma: %w: region exchange needs a connection set up by go-rdma's handshake, not rdma_cm", ErrNotSupported)

// ErrRegionRefused means the peer refused a RequestRegion.
var ErrRegionRefused = errors.New("peer refused the region request")

// Expose lets the peer reach exactly the memory of b with exactly the
// rights in access (RemoteRead, RemoteWrite, RemoteAtomic): it registers
// that range on its own and returns the region to hand to the peer (with
// SendRegion, or by any other means). The exposure lasts until Revoke or
// until the connection closes. An rkey is not a secret; expose as little
// as possible for as short as possible.
func (c *Conn) Expose(b Local, access Access) (RemoteRegion, error) {
	pb, off, n, err := local(b)
	if err != nil {
		return RemoteRegion{}, err
	}
	if pb.Pool() != c.eng.pool {
		return RemoteRegion{}, fmt.Errorf("rdma: expose: %w: buffer from another connection's pool", ErrInvalid)
	}
	return c.expose(pb, off, n, access, 0)
}

func (c *Conn) expose(pb *pool.Buffer, off, n int, access Access, granted int) (RemoteRegion, error) {
	if access == 0 || access&^(RemoteRead|RemoteWrite|RemoteAtomic) != 0 {
		return RemoteRegion{}, fmt.Errorf("rdma: expose with access %v: %w: want RemoteRead, RemoteWrite and/or RemoteAtomic", access, ErrInvalid)
	}
	if n == 0 {
		return RemoteRegion{}, fmt.Errorf("rdma: expose 0 bytes: %w", ErrInvalid)
	}
	if c.err() != nil {
		return RemoteRegion{}, c.closedErr()
	}
	if err := pb.Ref(); err != nil {
		return RemoteRegion{}, fmt.Errorf("rdma: expose: %w", err)
	}
	acc := access
	if acc&(RemoteWrite|RemoteAtomic) != 0 {
		acc |= verbs.AccessLocalWrite
	}
	mem := pb.Bytes()[off : off+n]
	mr, err := c.eng.pd.RegMR(mem, acc)
	if err != nil {
		pb.Unref()
		return RemoteRegion{}, fmt.Errorf("rdma: expose %d bytes: %w", n, err)
	}
	r := RemoteRegion{Addr: mr.Addr(), Len: n, RKey: mr.RKey()}
	c.emu.Lock()
	if c.closing.Load() {
		c.emu.Unlock()
		mr.Close()
		pb.Unref()
		return RemoteRegion{}, c.closedErr()
	}
	c.exposed[r.RKey] = &exposure{mr: mr, pb: pb, granted: granted}
	c.emu.Unlock()
	return r, nil
}

// Revoke ends an exposure made by Expose: the memory is deregistered and
// any later access by the peer fails with a remote access error. An
// access the peer has in flight when Revoke runs either completes before
// or fails; it never reaches memory that went back to the pool, because
// the exposure keeps its buffer referenced until the deregistration.
func (c *Conn) Revoke(r RemoteRegion) error {
	c.emu.Lock()
	x, ok := c.exposed[r.RKey]
	if ok {
		delete(c.exposed, r.RKey)
		c.granted -= x.granted
	}
	c.emu.Unlock()
	if !ok {
		return fmt.Errorf("rdma: revoke %v: %w: not exposed on this connection", r, ErrInvalid)
	}
	err := x.mr.Close()
	x.pb.Unref()
	if x.granted > 0 {
		x.pb.Release()
	}
	return err
}

// SendRegion hands r to the peer, whose RecvRegion returns it.
func (c *Conn) SendRegion(ctx context.Context, r RemoteRegion) error {
	return c.control(ctx, ctrlRegion, r.appendTo(nil))
}

// RecvRegion waits for a region the peer sends with SendRegion.
func (c *Conn) RecvRegion(ctx context.Context) (RemoteRegion, error) {
	if c.ctrl == nil {
		return RemoteRegion{}, errNoControl
	}
	select {
	case r, ok := <-c.regions:
		if !ok {
			return RemoteRegion{}, c.closedErr()
		}
		return r, nil
	case <-ctx.Done():
		return RemoteRegion{}, ctx.Err()
	}
}

// RequestRegion asks the peer to allocate size bytes and expose them to
// us with access. The peer decides (see WithRegionLimit); a refusal gives
// an error wrapping ErrRegionRefused. The region lives until the
// connection closes or ReleaseRegion.
func (c *Conn) RequestRegion(ctx context.Context, size int, access Access) (RemoteRegion, error) {
	if size <= 0 || access == 0 || access&^(RemoteRead|RemoteWrite|RemoteAtomic) != 0 {
		return RemoteRegion{}, fmt.Errorf("rdma: request region of %d bytes, access %v: %w", size, access, ErrInvalid)
	}
	if c.ctrl == nil {
		return RemoteRegion{}, errNoControl
	}
	ch := make(chan regionAnswer, 1)
	c.emu.Lock()
	if c.err() != nil {
		c.emu.Unlock()
		return RemoteRegion{}, c.closedErr()
	}
	c.nextReq++
	id := c.nextReq
	c.requests[id] = ch
	c.emu.Unlock()
	p := binary.BigEndian.AppendUint32(nil, id)
	p = binary.BigEndian.AppendUint64(p, uint64(size))
	p = binary.BigEndian.AppendUint32(p, uint32(access))
	if err := c.control(ctx, ctrlRequest, p); err != nil {
		c.forget(id)
		return RemoteRegion{}, err
	}
	select {
	case a := <-ch:
		return a.r, a.err
	case <-ctx.Done():
		// A late grant finds no request and is handed back to the peer.
		c.forget(id)
		return RemoteRegion{}, ctx.Err()
	}
}

// ReleaseRegion tells the peer that a region it granted to RequestRegion
// is no longer needed, so it can revoke it and free the memory.
func (c *Conn) ReleaseRegion(ctx context.Context, r RemoteRegion) error {
	return c.control(ctx, ctrlFree, binary.BigEndian.AppendUint32(nil, r.RKey))
}

func (c *Conn) forget(id uint32) {
	c.emu.Lock()
	delete(c.requests, id)
	c.emu.Unlock()
}

// control writes one control frame, bounded by ctx.
func (c *Conn) control(ctx context.Context, typ byte, p []byte) error {
	if c.ctrl == nil {
		return errNoControl
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.err() != nil {
		return c.closedErr()
	}
	c.ctrlMu.Lock()
	defer c.ctrlMu.Unlock()
	// Frames are tiny, so the socket buffer takes them at once; a write
	// that times out means a stuck peer, and a frame cut in half would
	// corrupt the channel, so a failed write fails the connection.
	c.ctrl.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := writeFrame(c.ctrl, typ, p); err != nil {
		if c.err() != nil {
			return c.closedErr()
		}
		err = fmt.Errorf("rdma: control channel: %w", err)
		c.fail(err)
		return err
	}
	return nil
}

// readControl serves the control channel until it closes. The end of the
// channel is the end of the connection: a peer that exits, even when
// killed, closes its socket, and this side then fails every pending
// operation instead of waiting for transport timeouts.
func (c *Conn) readControl(r *bufio.Reader) {
	defer close(c.ctrlDone)
	defer close(c.regions)
	buf := make([]byte, maxCtrl)
	for {
		typ, p, err := readFrame(r, buf)
		if err != nil {
			if c.closing.Load() {
				return
			}
			if errors.Is(err, io.EOF) {
				err = ErrPeerClosed
			}
			c.fail(fmt.Errorf("rdma: peer %v: %w", c.remote, err))
			return
		}
		switch typ {
		case ctrlRegion:
			var reg RemoteRegion
			if reg.UnmarshalBinary(p) == nil {
				select {
				case c.regions <- reg:
				case <-c.ctx.Done():
				}
			}
		case ctrlRequest:
			if len(p) == 16 {
				go c.grant(binary.BigEndian.Uint32(p), binary.BigEndian.Uint64(p[4:]), Access(binary.BigEndian.Uint32(p[12:])))
			}
		case ctrlGrant, ctrlDeny:
			c.answer(typ, p)
		case ctrlFree:
			if len(p) == 4 {
				c.Revoke(RemoteRegion{RKey: binary.BigEndian.Uint32(p)})
			}
		case ctrlClose:
			c.fail(fmt.Errorf("rdma: peer %v: %w", c.remote, ErrPeerClosed))
		}
	}
}

// grant serves a peer's RequestRegion.
func (c *Conn) grant(id uint32, size uint64, access Access) {
	reply := func(typ byte, p []byte) {
		c.control(context.Background(), typ, append(binary.BigEndian.AppendUint32(nil, id), p...))
	}
	deny := func(why string) { reply(ctrlDeny, []byte(why)) }
	if access == 0 || access&^(RemoteRead|RemoteWrite|RemoteAtomic) != 0 || size == 0 {
		deny(fmt.Sprintf("bad request: %d bytes, access %v", size, access))
		return
	}
	c.emu.Lock()
	limit := c.eng.cfg.maxExpose
	if size > uint64(limit-c.granted) {
		c.emu.Unlock()
		deny(fmt.Sprintf("%d bytes would pass the peer's region limit of %d bytes (%d granted)", size, limit, c.granted))
		return
	}
	c.granted += int(size)
	c.emu.Unlock()
	pb, err := c.eng.pool.Get(int(size))
	if err == nil {
		var r RemoteRegion
		if r, err = c.expose(pb, 0, int(size), access, int(size)); err == nil {
			reply(ctrlGrant, r.appendTo(nil))
			return
		}
		pb.Release()
	}
	c.emu.Lock()
	c.granted -= int(size)
	c.emu.Unlock()
	deny(err.Error())
}

// answer hands a grant or denial to the waiting RequestRegion; a grant
// nobody waits for any more is handed back.
func (c *Conn) answer(typ byte, p []byte) {
	if len(p) < 4 {
		return
	}
	id := binary.BigEndian.Uint32(p)
	var a regionAnswer
	if typ == ctrlGrant {
		if err := a.r.UnmarshalBinary(p[4:]); err != nil {
			a.err = err
		}
	} else {
		a.err = fmt.Errorf("rdma: %w: %s", ErrRegionRefused, p[4:])
	}
	c.emu.Lock()
	ch, ok := c.requests[id]
	delete(c.requests, id)
	c.emu.Unlock()
	if ok {
		ch <- a
	} else if typ == ctrlGrant && a.err == nil {
		go c.ReleaseRegion(context.Background(), a.r)
	}
}
