package rdma

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The out-of-band handshake runs over the TCP connection that Dial opens
// and Listen accepts. Each side sends a hello; the listener answers with
// its own hello or a refusal. Then both move their QPs to RTS and send one
// ready byte, so neither side sends before the other's receives are
// posted. The TCP connection stays open afterwards as the control channel
// (regions, region requests, orderly close) and as a liveness signal.

const (
	handshakeMagic   = "GO-RDMA\x00"
	handshakeVersion = 1
	maxReason        = 512
)

// ErrVersion means the peer speaks another version of the handshake.
var ErrVersion = errors.New("peer speaks another go-rdma protocol version")

// ErrNotRDMA means the peer did not answer with a go-rdma handshake.
var ErrNotRDMA = errors.New("peer is not a go-rdma endpoint")

// ErrRefused means the peer refused the connection; the error says why.
var ErrRefused = errors.New("connection refused by peer")

// hello is what each side tells the other about its queue pair.
type hello struct {
	Magic     [8]byte
	Version   uint16
	_         [2]byte
	Provider  [8]byte // "verbs" or "soft"
	QPN       uint32
	PSN       uint32
	LID       uint16
	MTU       uint8
	Flags     uint8
	GID       verbs.GID
	RecvDepth uint32 // receives the sender keeps posted
	MaxMsg    uint32 // largest SEND the sender accepts
}

func providerName(b [8]byte) string {
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	return string(b[:n])
}

func writeHello(w io.Writer, h *hello) error {
	copy(h.Magic[:], handshakeMagic)
	h.Version = handshakeVersion
	return binary.Write(w, binary.BigEndian, h)
}

// readHello reads and checks a hello. A peer that is no go-rdma endpoint,
// or speaks another version, gets a clear error.
func readHello(r io.Reader) (*hello, error) {
	var h hello
	if err := binary.Read(r, binary.BigEndian, &h); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: connection closed during the handshake", ErrNotRDMA)
		}
		return nil, err
	}
	if string(h.Magic[:]) != handshakeMagic {
		return nil, fmt.Errorf("%w: bad handshake magic %q", ErrNotRDMA, h.Magic[:])
	}
	if h.Version != handshakeVersion {
		return nil, fmt.Errorf("%w: peer version %d, ours %d", ErrVersion, h.Version, handshakeVersion)
	}
	return &h, nil
}

// Answers of the listener to a hello.
const (
	answerAccept = 0
	answerRefuse = 1
)

func writeRefusal(w io.Writer, reason string) error {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	b := make([]byte, 0, 3+len(reason))
	b = append(b, answerRefuse)
	b = binary.BigEndian.AppendUint16(b, uint16(len(reason)))
	b = append(b, reason...)
	_, err := w.Write(b)
	return err
}

// readAnswer reads the listener's answer: its hello, or a refusal.
func readAnswer(r *bufio.Reader) (*hello, error) {
	kind, err := r.ReadByte()
	if err != nil {
		return nil, fmt.Errorf("%w: no answer to the handshake: %v", ErrNotRDMA, err)
	}
	switch kind {
	case answerAccept:
		return readHello(r)
	case answerRefuse:
		var n uint16
		if err := binary.Read(r, binary.BigEndian, &n); err != nil || n > maxReason {
			return nil, fmt.Errorf("%w: malformed refusal", ErrNotRDMA)
		}
		reason := make([]byte, n)
		if _, err := io.ReadFull(r, reason); err != nil {
			return nil, fmt.Errorf("%w: malformed refusal", ErrNotRDMA)
		}
		return nil, fmt.Errorf("%w: %s", ErrRefused, reason)
	}
	return nil, fmt.Errorf("%w: unknown handshake answer %#x", ErrNotRDMA, kind)
}
