package rc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Control frames travel over the connection's TCP socket after the
// handshake: a type byte, a 16-bit length and at most MaxCtrl bytes.
const (
	CtrlRegion   = 1  // SendRegion: region
	CtrlRequest  = 2  // RequestRegion: id u32, size u64, access u32, lifetime ms u32
	CtrlGrant    = 3  // answer: id u32, region
	CtrlDeny     = 4  // answer: id u32, reason
	CtrlFree     = 5  // the requester no longer needs a granted region: rkey u32
	CtrlClose    = 6  // orderly close: the sender's operations are done, it posts no more
	CtrlTaken    = 7  // RecvRegion took a region: one SendRegion credit back
	CtrlRevoke   = 8  // the owner revokes a region: rkey u32
	CtrlRevoked  = 9  // answer to CtrlRevoke: no access to rkey u32 is in flight or will be posted
	CtrlCloseAck = 10 // answer to CtrlClose: this side's operations are done too
	CtrlCredit   = 11 // credits: u32 total the peer gave over the connection's life, answering an ask (returnCredits)
	CtrlAsk      = 12 // the sender asks for n u32 credits for messages it has waiting, having seen a u32 total, a u32 of them at once (what its first chain lacks), that chain's u32 credits
	CtrlBack     = 13 // the sender gives back the n u32 credits it held: its asks before are void, an ask follows if messages wait
	CtrlRecall   = 14 // the receiver asks for the credits the sender has no message for (others wait)
	CtrlAbort    = 15 // the sender failed for a reason of its own: reason text (Abort)
	CtrlPing     = 16 // the sender asks whether this side's process lives: a CtrlPong answers (the verdict)
	CtrlPong     = 17 // answer to CtrlPing
	MaxCtrl      = 1024
)

// ErrProtocol means the peer broke go-rdma's control protocol: a
// malformed frame, or more outstanding requests than it may have. The
// ErrProtocol: the peer broke the control protocol. rdma.ErrProtocol
// documents it for users.
var ErrProtocol = errors.New("peer broke the go-rdma control protocol")

func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxCtrl {
		return fmt.Errorf("rdma: control frame of %d bytes: %w", len(payload), verbs.ErrInvalid)
	}
	b := make([]byte, 3, 3+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint16(b[1:], uint16(len(payload)))
	_, err := w.Write(append(b, payload...))
	return err
}

// ReadFrame reads one frame; a length over MaxCtrl is a protocol error,
// never a large allocation.
func ReadFrame(r *bufio.Reader, buf []byte) (byte, []byte, error) {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint16(h[1:]))
	if n > MaxCtrl || n > cap(buf) {
		return 0, nil, fmt.Errorf("%w: control frame of %d bytes", ErrProtocol, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, err
	}
	return h[0], buf, nil
}

// ErrPeerClosed: the peer ended the connection and said so (its Close,
// or its failure or Abort with its reason). It wraps net.ErrClosed.
// rdma.ErrPeerClosed documents it for users.
var ErrPeerClosed error = peerClosedError{}

// ErrPeerLost: the peer went away without ending the connection. It
// wraps net.ErrClosed but is not ErrPeerClosed. rdma.ErrPeerLost
// documents it for users.
var ErrPeerLost error = peerLostError{}

// peerClosedError is ErrPeerClosed: it matches net.ErrClosed without
// repeating its text, which speaks of a use of a closed connection.
type peerClosedError struct{}

func (peerClosedError) Error() string { return "peer closed the connection" }
func (peerClosedError) Unwrap() error { return net.ErrClosed }

// peerLostError is ErrPeerLost; it matches net.ErrClosed, as
// peerClosedError does.
type peerLostError struct{}

func (peerLostError) Error() string { return "peer went away without closing the connection" }
func (peerLostError) Unwrap() error { return net.ErrClosed }
