package rdma

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// Control frames travel over the connection's TCP socket after the
// handshake: a type byte, a 16-bit length and at most maxCtrl bytes.
const (
	ctrlRegion  = 1 // SendRegion: region
	ctrlRequest = 2 // RequestRegion: id u32, size u64, access u32
	ctrlGrant   = 3 // answer: id u32, region
	ctrlDeny    = 4 // answer: id u32, reason
	ctrlFree    = 5 // the requester no longer needs a granted region: rkey u32
	ctrlClose   = 6 // orderly close
	maxCtrl     = 1024
)

func writeFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > maxCtrl {
		return fmt.Errorf("rdma: control frame of %d bytes: %w", len(payload), ErrInvalid)
	}
	b := make([]byte, 3, 3+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint16(b[1:], uint16(len(payload)))
	_, err := w.Write(append(b, payload...))
	return err
}

// readFrame reads one frame; a length over maxCtrl is a protocol error,
// never a large allocation.
func readFrame(r *bufio.Reader, buf []byte) (byte, []byte, error) {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint16(h[1:]))
	if n > maxCtrl || n > cap(buf) {
		return 0, nil, fmt.Errorf("%w: control frame of %d bytes", ErrNotRDMA, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, err
	}
	return h[0], buf, nil
}
