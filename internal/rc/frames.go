package rc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/go-rdma/rdma/internal/verbs"
)

// ReadControl serves the control channel until it closes. It never waits
// for the application or for the peer: whatever takes time (a grant, an
// answer, the fence of a revoke, the close handshake) goes to the
// connection's control worker, and what it queues is bounded by the
// limits above. The end of the channel is the end of the connection: a
// peer that exits, even when killed, closes its socket, and this side
// then fails every pending operation instead of waiting for transport
// timeouts: with ErrPeerLost, or, once the peer's close was heard, with
// the close's ErrPeerClosed.
func (c *Conn) ReadControl(r *bufio.Reader) {
	defer c.Ctl.End()
	buf := make([]byte, MaxCtrl)
	for {
		typ, p, err := ReadFrame(r, buf)
		c.Ctl.WaitSlow()
		if err != nil {
			if c.Life.Closing() || c.told.Load() {
				return // the end of our close or abort, not the peer's doing
			}
			switch {
			case errors.Is(err, ErrProtocol):
				// A frame too long: the peer is told and cut off, as for
				// every other illegal frame.
				c.CutOff(fmt.Errorf("rdma: peer %v: %w", c.Remote, err))
			case c.Life.CloseHeard():
				// The peer closed in order and then its socket: the
				// close's error, however the socket ended.
				c.Life.SetPeerClosed()
				c.Fail(c.Life.PeerClosedErr())
			default:
				// The socket ended without the peer's close: it
				// died (its kernel closed or reset the socket), or
				// the network between us did. The read's error
				// stays in the chain unless it is a plain end.
				c.Life.SetPeerClosed()
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, verbs.ErrClosed) {
					c.Fail(c.Life.PeerLostErr())
				} else {
					c.Fail(fmt.Errorf("%w (%w)", c.Life.PeerLostErr(), err))
				}
			}
			return
		}
		if c.Ctl.Deaf() {
			continue // tests: a peer that hears nothing
		}
		switch typ {
		case CtrlRegion:
			c.Regions.OnRegion(p)
		case CtrlTaken:
			c.Regions.OnTaken()
		case CtrlRequest:
			c.Regions.OnRequest(p)
		case CtrlGrant, CtrlDeny:
			c.Regions.OnAnswer(typ, p)
		case CtrlFree:
			if v, ok := c.word(p, "release"); ok {
				c.Regions.OnFree(v)
			}
		case CtrlRevoke:
			if v, ok := c.word(p, "revoke"); ok {
				c.Regions.OnRevoke(v)
			}
		case CtrlRevoked:
			if v, ok := c.word(p, "revoke answer"); ok {
				c.Regions.OnRevoked(v)
			}
		case CtrlClose:
			c.onPeerClose()
		case CtrlCredit:
			if v, ok := c.word(p, "credit"); ok {
				c.SQ.OnCredit(v)
			}
		case CtrlAsk:
			if len(p) != 16 {
				c.ProtocolErr("malformed credit request")
			} else if c.SRQ != nil {
				c.Grants.OnAsk(binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]), binary.BigEndian.Uint32(p[8:]),
					binary.BigEndian.Uint32(p[12:]))
			}
		case CtrlBack:
			if v, ok := c.word(p, "credit return"); ok && c.SRQ != nil {
				c.Grants.OnBack(v)
			}
		case CtrlRecall:
			if len(p) != 0 {
				c.ProtocolErr("malformed credit recall")
			} else {
				c.SQ.OnRecall()
			}
		case CtrlAbort:
			c.onPeerAbort(p)
		case CtrlCloseAck:
			c.Ctl.AckClose()
		case CtrlPing:
			if len(p) != 0 {
				c.ProtocolErr("malformed ping")
			} else {
				c.Ctl.Pong()
			}
		case CtrlPong:
			if len(p) != 0 {
				c.ProtocolErr("malformed pong")
			} else {
				c.vd.onPong()
			}
		default:
			c.ProtocolErr("unknown control frame %d", typ)
		}
		if errors.Is(c.Life.Err(), ErrProtocol) {
			return // the peer is cut off: nothing more of it is served
		}
	}
}

// word decodes the one 32-bit field of a frame, cutting the peer off
// when the frame is not exactly that.
func (c *Conn) word(p []byte, what string) (uint32, bool) {
	if len(p) != 4 {
		c.ProtocolErr("malformed %s", what)
		return 0, false
	}
	return binary.BigEndian.Uint32(p), true
}

// onPeerClose handles the peer's orderly close: nothing new is posted,
// the operations this side has in flight finish (bounded), and the peer
// hears that they did before it tears down its queue pair. A message it
// received before its Close therefore completes here as delivered.
func (c *Conn) onPeerClose() {
	if c.Life.HearClose() {
		return // said twice: once is served
	}
	c.Ctl.HearClose()
	c.Ctl.Later(func() {
		c.quiesce(c.Life.PeerClosedErr(), false)
		c.Ctl.Write(CtrlCloseAck, nil)
		c.Fail(c.Life.PeerClosedErr())
	})
}

// quiesce stops new posts and waits (bounded by RevokeBound) until what
// was issued before has completed. Operations still queued for room or
// credits go out while the peer makes room; when it makes none for
// half a second (it does not read: SendQueue.Quiesce), or when the peer is the one closing
// (drain false), they fail with why: they never reached the device. It
// runs once; Close and the peer's close share it.
func (c *Conn) quiesce(why error, drain bool) {
	c.quiesceOnce.Do(func() {
		ctx, cancel := context.WithTimeout(c.ctx, RevokeBound)
		defer cancel()
		c.SQ.Quiesce(ctx, why, drain)
		c.SQ.WaitSent(ctx)
	})
}
