// Package rc is one reliable connection of go-rdma, below the API that
// users name (package rdma). It holds, so far, the connection's wire
// protocol: the hello of the handshake, the control channel's frames, and
// the errors a peer's words become. The connection itself and its parts
// move here from the root package step by step (docs/architecture.md).
package rc

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The out-of-band handshake runs over the TCP connection that Dial opens
// and Listen accepts. Each side sends a hello; the listener answers with
// its own hello or a refusal. Then both move their QPs to RTS and send one
// ready byte, so neither side sends before the other's receives are
// posted. The TCP connection stays open afterwards as the control channel
// (regions, region requests, orderly close) and as a liveness signal.

const (
	// MagicBytes start a hello.
	MagicBytes = "GO-RDMA\x00"
	// Version is the handshake's version: a peer of another is refused.
	Version   = 11
	maxReason = 512
)

// ErrVersion: the peer speaks another version of the handshake.
// rdma.ErrVersion documents it for users.
var ErrVersion = errors.New("peer speaks another go-rdma protocol version")

// ErrNotRDMA: the peer did not answer with a go-rdma handshake.
// rdma.ErrNotRDMA documents it for users.
var ErrNotRDMA = errors.New("peer is not a go-rdma endpoint")

// ErrRefused: the peer refused the connection.
// rdma.ErrRefused documents it for users.
var ErrRefused = errors.New("connection refused by peer")

// Hello is what each side tells the other about its queue pair.
type Hello struct {
	Magic   [8]byte
	Version uint16
	// EOL is "\r\n" (zeros from a peer before v0.2.0; it is not read):
	// a line-based server dialed by mistake, HTTP's above all, reads the
	// bytes before it as a malformed request line and answers at once,
	// so the dial fails in a round trip instead of at the handshake's
	// bound (ReadAnswer).
	EOL       [2]byte
	Provider  [8]byte // "verbs" or "soft"
	QPN       uint32
	PSN       uint32
	LID       uint16
	MTU       uint8
	Flags     uint8 // HelloUC, HelloFallback, HelloNoDevice, HelloTCP
	GID       verbs.GID
	RecvDepth uint32 // the sender's credit cap: the most messages it takes in flight
	MaxMsg    uint32 // largest SEND the sender accepts
	// The sender's credit word (creditWord): the peer writes the
	// credits it gives there. Zero on connections without credits.
	CreditAddr uint64
	CreditRKey uint32
	RecvWindow uint32 // the sender's Conn.RecvWindow
	// The application protocol the sender speaks on the connection
	// (WithProtocol), NUL-padded; all zero for the plain async API.
	Protocol [MaxProtocol]byte
}

func ProviderName(b [8]byte) string {
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	return string(b[:n])
}

func WriteHello(w io.Writer, h *Hello) error {
	copy(h.Magic[:], MagicBytes)
	h.Version = Version
	h.EOL = [2]byte{'\r', '\n'}
	return binary.Write(w, binary.BigEndian, h)
}

// ReadHello reads and checks a Hello. A peer that is no go-rdma endpoint,
// or speaks another version, gets a clear error.
func ReadHello(r io.Reader) (*Hello, error) {
	var h Hello
	if err := binary.Read(r, binary.BigEndian, &h); err != nil {
		return nil, HandshakeReadErr("Hello", err, false)
	}
	if string(h.Magic[:]) != MagicBytes {
		return nil, fmt.Errorf("%w: bad handshake magic %q", ErrNotRDMA, h.Magic[:])
	}
	if h.Version != Version {
		return nil, fmt.Errorf("%w: peer version %d, ours %d", ErrVersion, h.Version, Version)
	}
	return &h, nil
}

// HandshakeReadErr explains a failed read of the handshake's what, so
// that a peer that is silent, one that went away and one that speaks
// something else read differently:
//   - the bound ran out (WithHandshakeTimeout, or the context's deadline,
//     which Dial then names): it matches os.ErrDeadlineExceeded;
//   - the peer closed or reset the socket: ErrPeerClosed. Before the
//     peer's Hello that may also be a server of another protocol giving
//     up on ours, so it matches ErrNotRDMA as well, unless known (the
//     peer's Hello came) to be a go-rdma endpoint;
//   - anything else is ErrNotRDMA.
func HandshakeReadErr(what string, err error, goRDMA bool) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("rdma: no %s from the peer within the handshake's bound: %w", what, err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		if goRDMA {
			return fmt.Errorf("rdma: %w before its %s (it died or gave up)", ErrPeerClosed, what)
		}
		return fmt.Errorf("rdma: %w before its %s: it died, gave up, or %w", ErrPeerClosed, what, ErrNotRDMA)
	}
	return fmt.Errorf("%w: no %s: %v", ErrNotRDMA, what, err)
}

// Answers of the listener to a Hello.
const (
	AnswerAccept = 0
	AnswerRefuse = 1
)

func WriteRefusal(w io.Writer, reason string) error {
	// The dialer says "rdma" and "refused" itself (ReadAnswer).
	reason = strings.TrimPrefix(strings.TrimPrefix(reason, "rdma: "), ErrRefused.Error()+": ")
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	b := make([]byte, 0, 3+len(reason))
	b = append(b, AnswerRefuse)
	b = binary.BigEndian.AppendUint16(b, uint16(len(reason)))
	b = append(b, reason...)
	_, err := w.Write(b)
	return err
}

// ReadAnswer reads the listener's answer: its Hello, or a refusal.
func ReadAnswer(r *bufio.Reader) (*Hello, error) {
	kind, err := r.ReadByte()
	if err != nil {
		return nil, HandshakeReadErr("answer to the handshake", err, false)
	}
	switch kind {
	case AnswerAccept:
		return ReadHello(r)
	case AnswerRefuse:
		var n uint16
		if err := binary.Read(r, binary.BigEndian, &n); err != nil || n > maxReason {
			return nil, fmt.Errorf("%w: malformed refusal", ErrNotRDMA)
		}
		reason := make([]byte, n)
		if _, err := io.ReadFull(r, reason); err != nil {
			return nil, fmt.Errorf("%w: malformed refusal", ErrNotRDMA)
		}
		return nil, fmt.Errorf("rdma: %w: the listener says: %q", ErrRefused, reason)
	}
	r.UnreadByte()
	return nil, otherAnswer(r)
}

// maxOtherAnswer bounds what an error quotes of a server of another
// protocol's answer.
const maxOtherAnswer = 64

// otherAnswer is the error for an answer that is no go-rdma answer: it
// quotes the first bytes that came (what r holds already; waiting for
// more could wait for the handshake's bound), naming an HTTP server as
// such.
func otherAnswer(r *bufio.Reader) error {
	b, _ := r.Peek(min(r.Buffered(), maxOtherAnswer))
	if bytes.HasPrefix(b, []byte("HTTP/")) {
		if i := bytes.IndexByte(b, '\r'); i >= 0 {
			b = b[:i] // its status line
		}
		return fmt.Errorf("%w: an HTTP server answered: %q (dialed its port instead of the listener's?)", ErrNotRDMA, b)
	}
	return fmt.Errorf("%w: the peer answered %q", ErrNotRDMA, b)
}

// MaxProtocol is the longest application protocol name the hello carries
// (rdma.WithProtocol).
const MaxProtocol = 32

// HelloUC in Hello.Flags: the sender's QP is UC (the unreliable
// connected transport), not RC.
const HelloUC = 1 << 0

// The TCP fallback's flags in Hello.Flags.
const (
	// HelloFallback: the sender would carry the connection's bytes over
	// the handshake's TCP connection where a side has no RDMA device.
	HelloFallback = 1 << 1
	// HelloNoDevice: the sender has no usable RDMA device (its provider
	// was chosen by "auto" and is soft).
	HelloNoDevice = 1 << 2
	// HelloTCP, in the listener's answer: the connection falls back, and
	// its bytes go over the TCP connection; the answer describes no QP.
	HelloTCP = 1 << 3
)

// FallBack is the listener's decision on the flags of its hello (mine)
// and of the dialer's: the connection falls back to TCP when both sides
// allow it and at least one has no device.
func FallBack(mine, peer uint8) bool {
	return mine&peer&HelloFallback != 0 && (mine|peer)&HelloNoDevice != 0
}

// SameTransport refuses a peer whose QP is of another transport than
// ours (uc: UC, else RC): an RC QP and a UC QP cannot talk. dialing says
// which side this is, for the error's words.
func SameTransport(uc bool, peer *Hello, dialing bool) error {
	theirs := peer.Flags&HelloUC != 0
	if theirs == uc {
		return nil
	}
	name := func(uc bool) string {
		if uc {
			return "UC"
		}
		return "RC"
	}
	if dialing {
		return fmt.Errorf("rdma: %w: this dialer's transport is %s, the listener's %s (WithTransport)", ErrRefused, name(uc), name(theirs))
	}
	return fmt.Errorf("rdma: %w: the dialer's transport is %s, this listener's %s (WithTransport)", ErrRefused, name(theirs), name(uc))
}

// SameProtocol refuses a peer whose Hello names another protocol than
// ours; dialing says which side this is, for the error's words.
func SameProtocol(ours string, peer *Hello, dialing bool) error {
	return MatchProtocol(ours, ProtocolName(peer.Protocol[:]), dialing)
}

// ProtocolName is the name in a NUL-padded protocol field.
func ProtocolName(field []byte) string {
	if i := bytes.IndexByte(field, 0); i >= 0 {
		field = field[:i]
	}
	return string(field)
}

// MatchProtocol refuses a peer that speaks theirs when we speak ours.
func MatchProtocol(ours, theirs string, dialing bool) error {
	if theirs == ours {
		return nil
	}
	if dialing {
		return fmt.Errorf("rdma: %w: this dialer speaks %s, the listener %s", ErrRefused, describeProtocol(ours), describeProtocol(theirs))
	}
	return fmt.Errorf("rdma: %w: the dialer speaks %s, this listener %s", ErrRefused, describeProtocol(theirs), describeProtocol(ours))
}

func describeProtocol(name string) string {
	if name == "" {
		return "the plain async API (no protocol)"
	}
	return "protocol " + strconv.Quote(name)
}
