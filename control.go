package rdma

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-rdma/rdma/internal/rc"
)

// closeAckBound is how long Close waits for the peer to say that its
// operations are done.
const closeAckBound = 2 * time.Second

// protocolErr cuts the peer off for breaking the control protocol.
func (c *conn) protocolErr(format string, args ...any) {
	c.cutOff(fmt.Errorf("rdma: peer %v: %w: %s", c.remote, ErrProtocol, fmt.Sprintf(format, args...)))
}

// cutOff fails the connection and ends its control channel, so the
// peer sees its connection end too instead of waiting for answers: the
// failure tells the peer why (tellPeer), then ends the channel; a peer
// told already, or that ended it, is cut off here.
func (c *conn) cutOff(err error) {
	c.fail(err)
	if !c.told.Load() {
		c.ctl.Conn().Close()
	}
}

// readControl serves the control channel until it closes. It never waits
// for the application or for the peer: whatever takes time (a grant, an
// answer, the fence of a revoke, the close handshake) goes to the
// connection's control worker, and what it queues is bounded by the
// limits above. The end of the channel is the end of the connection: a
// peer that exits, even when killed, closes its socket, and this side
// then fails every pending operation instead of waiting for transport
// timeouts: with ErrPeerLost, or, once the peer's close was heard, with
// the close's ErrPeerClosed.
func (c *conn) readControl(r *bufio.Reader) {
	defer c.ctl.End()
	buf := make([]byte, rc.MaxCtrl)
	for {
		typ, p, err := rc.ReadFrame(r, buf)
		c.ctl.WaitSlow()
		if err != nil {
			if c.life.Closing() || c.told.Load() {
				return // the end of our close or abort, not the peer's doing
			}
			switch {
			case errors.Is(err, ErrProtocol):
				// A frame too long: the peer is told and cut off, as for
				// every other illegal frame.
				c.cutOff(fmt.Errorf("rdma: peer %v: %w", c.remote, err))
			case c.life.CloseHeard():
				// The peer closed in order and then its socket: the
				// close's error, however the socket ended.
				c.life.SetPeerClosed()
				c.fail(c.life.PeerClosedErr())
			default:
				// The socket ended without the peer's close: it
				// died (its kernel closed or reset the socket), or
				// the network between us did. The read's error
				// stays in the chain unless it is a plain end.
				c.life.SetPeerClosed()
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrClosed) {
					c.fail(c.life.PeerLostErr())
				} else {
					c.fail(fmt.Errorf("%w (%w)", c.life.PeerLostErr(), err))
				}
			}
			return
		}
		if c.ctl.Deaf() {
			continue // tests: a peer that hears nothing
		}
		switch typ {
		case rc.CtrlRegion:
			c.rg.OnRegion(p)
		case rc.CtrlTaken:
			c.rg.OnTaken()
		case rc.CtrlRequest:
			c.rg.OnRequest(p)
		case rc.CtrlGrant, rc.CtrlDeny:
			c.rg.OnAnswer(typ, p)
		case rc.CtrlFree:
			if v, ok := c.word(p, "release"); ok {
				c.rg.OnFree(v)
			}
		case rc.CtrlRevoke:
			if v, ok := c.word(p, "revoke"); ok {
				c.rg.OnRevoke(v)
			}
		case rc.CtrlRevoked:
			if v, ok := c.word(p, "revoke answer"); ok {
				c.rg.OnRevoked(v)
			}
		case rc.CtrlClose:
			c.onPeerClose()
		case rc.CtrlCredit:
			if v, ok := c.word(p, "credit"); ok {
				c.sq.OnCredit(v)
			}
		case rc.CtrlAsk:
			if len(p) != 16 {
				c.protocolErr("malformed credit request")
			} else if c.srq != nil {
				c.cr.OnAsk(binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]), binary.BigEndian.Uint32(p[8:]),
					binary.BigEndian.Uint32(p[12:]))
			}
		case rc.CtrlBack:
			if v, ok := c.word(p, "credit return"); ok && c.srq != nil {
				c.cr.OnBack(v)
			}
		case rc.CtrlRecall:
			if len(p) != 0 {
				c.protocolErr("malformed credit recall")
			} else {
				c.sq.OnRecall()
			}
		case rc.CtrlAbort:
			c.onPeerAbort(p)
		case rc.CtrlCloseAck:
			c.ctl.AckClose()
		default:
			c.protocolErr("unknown control frame %d", typ)
		}
		if errors.Is(c.life.Err(), ErrProtocol) {
			return // the peer is cut off: nothing more of it is served
		}
	}
}

// word decodes the one 32-bit field of a frame, cutting the peer off
// when the frame is not exactly that.
func (c *conn) word(p []byte, what string) (uint32, bool) {
	if len(p) != 4 {
		c.protocolErr("malformed %s", what)
		return 0, false
	}
	return binary.BigEndian.Uint32(p), true
}

// onPeerClose handles the peer's orderly close: nothing new is posted,
// the operations this side has in flight finish (bounded), and the peer
// hears that they did before it tears down its queue pair. A message it
// received before its Close therefore completes here as delivered.
func (c *conn) onPeerClose() {
	if c.life.HearClose() {
		return // said twice: once is served
	}
	c.ctl.HearClose()
	c.ctl.Later(func() {
		c.quiesce(c.life.PeerClosedErr(), false)
		c.ctl.Write(rc.CtrlCloseAck, nil)
		c.fail(c.life.PeerClosedErr())
	})
}

// quiesce stops new posts and waits (bounded by rc.RevokeBound) until what
// was issued before has completed. Operations still queued for room or
// credits go out while the peer makes room; when it makes none for
// half a second (it does not read: rc.SendQueue.Quiesce), or when the peer is the one closing
// (drain false), they fail with why: they never reached the device. It
// runs once; Close and the peer's close share it.
func (c *conn) quiesce(why error, drain bool) {
	c.quiesceOnce.Do(func() {
		ctx, cancel := context.WithTimeout(c.ctx, rc.RevokeBound)
		defer cancel()
		c.sq.Quiesce(ctx, why, drain)
		c.sq.WaitSent(ctx)
	})
}
