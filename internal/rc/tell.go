package rc

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// A connection that fails for a reason of its own (a failed completion,
// a protocol error, Abort; not a Close here, not the peer's end) tells
// its peer at once, so the peer's pending operations fail in bounded
// time with that reason instead of waiting for something that will not
// come. On a TCP set-up the reason goes in a CtrlAbort frame, after which
// this side shuts its control channel for writing (the peer reads the
// reason, then the end); through rdma_cm a disconnect says it, without a
// reason.
const (
	// maxAbortReason bounds the reason an abort frame carries, sent and
	// read: a longer one from the peer is cut to it.
	maxAbortReason = 256
	// abortBound is how long the abort frame may take to go out; a peer
	// that does not take it is cut off.
	abortBound = time.Second
)

// tellPeer tells the peer that the connection failed with err, when err
// is a failure of this side's own; Fail calls it. It does not block: a
// poller may be the caller.
func (c *Conn) tellPeer(err error) {
	// Before the handshake completed, the set-up's own error tells the
	// peer; a frame would only garble the handshake.
	if !c.Life.Up() || c.Life.Closing() || c.Life.PeerClosed() || errors.Is(err, ErrPeerClosed) || errors.Is(err, ErrPeerLost) || (c.Ctl.Conn() == nil && c.CM == nil) {
		return
	}
	c.tellMu.Lock()
	if c.untold || !c.told.CompareAndSwap(false, true) {
		c.tellMu.Unlock()
		return
	}
	c.telling.Add(1)
	c.tellMu.Unlock()
	go func() {
		defer c.telling.Done()
		if c.CM != nil {
			// The peer's rdma_cm reports the disconnect; the QP stays
			// as it is (Disconnect).
			c.CM.Disconnect()
			return
		}
		werr := c.Ctl.WriteLast(CtrlAbort, abortReason(err), abortBound)
		if cw, ok := c.Ctl.Conn().(interface{ CloseWrite() error }); ok && werr == nil {
			cw.CloseWrite()
			return
		}
		c.Ctl.Conn().Close() // the peer did not take the frame: cut it off
	}()
}

// abortReason is err's text, cut to maxAbortReason bytes of valid UTF-8.
func abortReason(err error) []byte {
	b := []byte(err.Error())
	if len(b) > maxAbortReason {
		b = b[:maxAbortReason]
		for len(b) > 0 && !utf8.Valid(b) {
			b = b[:len(b)-1]
		}
	}
	return b
}

// onPeerAbort handles the peer's abort frame: the connection fails with
// ErrPeerClosed and the peer's reason, quoted (the peer is untrusted:
// its text is bounded and cannot forge lines of ours).
func (c *Conn) onPeerAbort(p []byte) {
	if len(p) > maxAbortReason {
		p = p[:maxAbortReason]
	}
	// The reason first, then peerClosed: a completion that fails
	// meanwhile (the bad access that made the peer abort may have failed a
	// receive here too) then says either its own status or the reason.
	c.Fail(fmt.Errorf("rdma: peer %v: %w: it aborted: %q", c.Remote, ErrPeerClosed, p))
	c.Life.SetPeerClosed()
}
