package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The wire format between two soft providers (other processes or hosts).
//
// Every frame is a fixed 64-byte header followed by Length payload bytes.
// All integers are big-endian. The first eight bytes are the same in every
// version, so a peer of another version is always recognised:
//
//	off size field
//	  0   4  magic "SRMA"
//	  4   1  version
//	  5   1  type (hello, request, ack, nak, read response, atomic response)
//	  6   1  op: the verbs.Opcode of a request, the reason code of a NAK
//	  7   1  flags (immediate present, solicited)
//	  8   4  destination QPN
//	 12   4  source QPN
//	 16   4  PSN (24 bits)
//	 20   4  payload length
//	 24   4  immediate value (host order value, carried big-endian)
//	 28   4  rkey (WRITE, READ, atomics) or Q_Key (UD)
//	 32   8  remote address
//	 40   8  CAS compare / FAA addend; READ length; atomic response value
//	 48   8  CAS swap value
//	 56   4  aux: NAK RNR timer
//	 60   1  QP type of the requester
//	 61   3  reserved, zero
//
// A connection starts with a hello from each side, whose payload is the
// sender's listener address (16-byte IP, 2-byte port). A side that meets a
// hello of another version answers with its own hello and closes; the
// dialer reports the mismatch.

const (
	wireMagic   = 0x53524d41 // "SRMA"
	wireVersion = 1
	hdrSize     = 64
	prefixSize  = 8
	helloLen    = 18

	// maxMsgSize bounds every message: nothing larger is ever read or
	// accepted, and payloads are read straight into registered memory
	// after they have been checked against it.
	maxMsgSize = 1 << 30
	// udMTU is the largest UD message.
	udMTU = 4096
)

// Frame types.
const (
	frameHello      = 1
	frameRequest    = 2
	frameAck        = 3
	frameNak        = 4
	frameReadResp   = 5
	frameAtomicResp = 6
)

// Frame flags.
const (
	flagImm       = 1 << 0
	flagSolicited = 1 << 1
	flagsKnown    = flagImm | flagSolicited
)

// NAK reasons, carried in the op byte of a NAK and reported as the
// VendorErr of the failed completion.
const (
	nakRNR       = 1 // receiver not ready; aux holds the RNR timer
	nakRemAccess = 2 // bad rkey, range or rights
	nakInvReq    = 3 // message too long for the receive, bad opcode
	nakRemOp     = 4 // the responder failed locally (bad receive SGE)
	nakUnknownQP = 5 // no such QP at the responder
	nakNotReady  = 6 // the responder QP is not in RTR/RTS, or in ERR
	nakPSN       = 7 // PSN out of sequence
	nakWrongPeer = 8 // the responder QP is connected to someone else
	nakMax       = 8
)

// Vendor error codes that the soft provider reports in VendorErr of failed
// completions. 1..9 are the NAK reasons above (the responder's verdict);
// the values below are found by the requester itself.
const (
	VendorErrRNR       = nakRNR
	VendorErrRemAccess = nakRemAccess
	VendorErrInvReq    = nakInvReq
	VendorErrRemOp     = nakRemOp
	VendorErrUnknownQP = nakUnknownQP
	VendorErrNotReady  = nakNotReady
	VendorErrPSN       = nakPSN
	VendorErrWrongPeer = nakWrongPeer
	VendorErrConnLost  = 0x10 // the TCP connection to the peer failed
	VendorErrTimeout   = 0x11 // no response within the QP's timeout
	VendorErrProtocol  = 0x12 // the peer sent a malformed frame
	VendorErrConnect   = 0x13 // the peer could not be reached or refused us
	VendorErrLocal     = 0x14 // a local SGE failed its lkey, range or rights check
	VendorErrTooLong   = 0x15 // the message exceeds the maximum size or UD MTU
	VendorErrCQOverrun = 0x16 // a CQ of the QP overflowed
)

var nakNames = [...]string{"", "RNR", "remote access", "invalid request", "remote operation", "unknown QP", "QP not ready", "PSN sequence", "wrong peer"}

// errProtocol marks a frame that breaks the wire format.
var errProtocol = errors.New("soft: protocol error")

// header is a decoded frame header.
type header struct {
	typ     uint8
	op      uint8
	flags   uint8
	qpType  verbs.QPType
	dst     uint32
	src     uint32
	psn     uint32
	length  uint32
	imm     uint32
	key     uint32
	addr    uint64
	compare uint64
	swap    uint64
	aux     uint32
}

func (h *header) encode(b *[hdrSize]byte) {
	be := binary.BigEndian
	be.PutUint32(b[0:], wireMagic)
	b[4] = wireVersion
	b[5] = h.typ
	b[6] = h.op
	b[7] = h.flags
	be.PutUint32(b[8:], h.dst)
	be.PutUint32(b[12:], h.src)
	be.PutUint32(b[16:], h.psn)
	be.PutUint32(b[20:], h.length)
	be.PutUint32(b[24:], h.imm)
	be.PutUint32(b[28:], h.key)
	be.PutUint64(b[32:], h.addr)
	be.PutUint64(b[40:], h.compare)
	be.PutUint64(b[48:], h.swap)
	be.PutUint32(b[56:], h.aux)
	b[60] = uint8(h.qpType)
	b[61], b[62], b[63] = 0, 0, 0
}

// VersionError is a peer that speaks another version of the wire format.
type VersionError struct {
	Peer string
	Got  uint8
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("soft: peer %s speaks wire version %d; this build speaks version %d (upgrade both sides to the same go-rdma)", e.Peer, e.Got, wireVersion)
}

// checkPrefix validates the version-independent first bytes of a frame.
func checkPrefix(b []byte) error {
	if m := binary.BigEndian.Uint32(b[0:]); m != wireMagic {
		return fmt.Errorf("%w: bad magic %#08x (not a soft RDMA peer)", errProtocol, m)
	}
	if v := b[4]; v != wireVersion {
		return &VersionError{Got: v}
	}
	return nil
}

// decodeHeader decodes and validates one header. It bounds every length
// by the wire limits; the receiver bounds it further by the memory it
// targets before reading a byte of payload.
func decodeHeader(b []byte, h *header) error {
	if len(b) < hdrSize {
		return fmt.Errorf("%w: truncated header (%d of %d bytes)", errProtocol, len(b), hdrSize)
	}
	if err := checkPrefix(b); err != nil {
		return err
	}
	be := binary.BigEndian
	*h = header{
		typ:     b[5],
		op:      b[6],
		flags:   b[7],
		dst:     be.Uint32(b[8:]),
		src:     be.Uint32(b[12:]),
		psn:     be.Uint32(b[16:]),
		length:  be.Uint32(b[20:]),
		imm:     be.Uint32(b[24:]),
		key:     be.Uint32(b[28:]),
		addr:    be.Uint64(b[32:]),
		compare: be.Uint64(b[40:]),
		swap:    be.Uint64(b[48:]),
		aux:     be.Uint32(b[56:]),
		qpType:  verbs.QPType(b[60]),
	}
	if b[61]|b[62]|b[63] != 0 {
		return fmt.Errorf("%w: reserved header bytes set", errProtocol)
	}
	if h.flags&^flagsKnown != 0 {
		return fmt.Errorf("%w: unknown flags %#x", errProtocol, h.flags)
	}
	if h.psn > psnMask || h.dst > qpnMask || h.src > qpnMask {
		return fmt.Errorf("%w: PSN or QPN beyond 24 bits", errProtocol)
	}
	if h.length > maxMsgSize {
		return fmt.Errorf("%w: payload of %d bytes exceeds the %d-byte maximum", errProtocol, h.length, maxMsgSize)
	}
	switch h.typ {
	case frameHello:
		if h.length != helloLen {
			return fmt.Errorf("%w: hello of %d bytes", errProtocol, h.length)
		}
	case frameRequest:
		op := verbs.Opcode(h.op)
		if h.qpType != verbs.RC && h.qpType != verbs.UC && h.qpType != verbs.UD {
			return fmt.Errorf("%w: request from QP type %d", errProtocol, h.qpType)
		}
		if !op.Supports(h.qpType) {
			return fmt.Errorf("%w: opcode %v on a %v QP", errProtocol, op, h.qpType)
		}
		switch {
		case op == verbs.OpRead:
			if h.length != 0 || h.compare > maxMsgSize {
				return fmt.Errorf("%w: READ with payload or of %d bytes", errProtocol, h.compare)
			}
		case op.IsAtomic():
			if h.length != 0 || h.addr%8 != 0 {
				return fmt.Errorf("%w: atomic with payload or unaligned address %#x", errProtocol, h.addr)
			}
		case h.qpType == verbs.UD && h.length > udMTU:
			return fmt.Errorf("%w: UD message of %d bytes exceeds the %d-byte MTU", errProtocol, h.length, udMTU)
		}
		if h.flags&flagImm != 0 && op != verbs.OpSendWithImm && op != verbs.OpWriteWithImm {
			return fmt.Errorf("%w: immediate on %v", errProtocol, op)
		}
	case frameAck, frameAtomicResp:
		if h.length != 0 {
			return fmt.Errorf("%w: response type %d with payload", errProtocol, h.typ)
		}
	case frameNak:
		if h.length != 0 || h.op == 0 || h.op > nakMax {
			return fmt.Errorf("%w: NAK with payload or unknown reason %d", errProtocol, h.op)
		}
	case frameReadResp:
	default:
		return fmt.Errorf("%w: unknown frame type %d", errProtocol, h.typ)
	}
	return nil
}

// readHeader reads one header from r into buf and decodes it. The prefix
// is read first so that a peer of another version, whose header may have
// another size, is recognised rather than waited for.
func readHeader(r io.Reader, buf *[hdrSize]byte, h *header) error {
	if _, err := io.ReadFull(r, buf[:prefixSize]); err != nil {
		return err
	}
	if err := checkPrefix(buf[:]); err != nil {
		return err
	}
	if _, err := io.ReadFull(r, buf[prefixSize:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%w: truncated header: %w", errProtocol, err)
	}
	return decodeHeader(buf[:], h)
}

func encodeHello(b []byte, addr netip.AddrPort) {
	a := addr.Addr().As16()
	copy(b, a[:])
	binary.BigEndian.PutUint16(b[16:], addr.Port())
}

func decodeHello(b []byte) (netip.AddrPort, error) {
	if len(b) != helloLen {
		return netip.AddrPort{}, fmt.Errorf("%w: hello of %d bytes", errProtocol, len(b))
	}
	ap := netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[:16])).Unmap(), binary.BigEndian.Uint16(b[16:]))
	if !ap.Addr().IsValid() || ap.Port() == 0 || ap.Addr().IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("%w: hello names no usable address (%v)", errProtocol, ap)
	}
	return ap, nil
}

const (
	psnMask = 1<<24 - 1
	qpnMask = 1<<24 - 1
)

// psnBefore reports a < b in 24-bit serial arithmetic.
func psnBefore(a, b uint32) bool { return (a-b)&psnMask > 1<<23 }
