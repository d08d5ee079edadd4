package ud

import (
	"encoding/binary"
	"errors"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The side channel's one message, a request or its answer, in 64 bytes
// (big-endian):
//
//	off len
//	  0   4  magic "RDUD"
//	  4   1  version (1)
//	  5   1  kind: 1 request, 2 answer
//	  6   2  zero
//	  8   8  nonce: the request's, repeated by its answer
//	 16   4  the sender's UD QP number
//	 20   4  its Q_Key
//	 24  16  its GID
//	 40   2  its LID (0 on RoCE; the soft provider routes by it)
//	 42   2  the largest datagram it takes (its path MTU in bytes)
//	 44  20  zero
//
// Both kinds carry the sender's own route, so a request announces its
// sender as the answer announces the answerer. A request and its answer
// have the same size: the side channel cannot amplify a spoofed request.
const msgSize = 64

const (
	msgMagic   = "RDUD"
	msgVersion = 1
	kindReq    = 1
	kindAns    = 2
)

// msg is a side-channel message, parsed.
type msg struct {
	kind  uint8
	nonce uint64
	route Route
}

var errBadMsg = errors.New("not a datagram side-channel message")

// put writes m into b[:msgSize].
func (m *msg) put(b []byte) {
	b = b[:msgSize]
	clear(b)
	copy(b[0:4], msgMagic)
	b[4], b[5] = msgVersion, m.kind
	binary.BigEndian.PutUint64(b[8:16], m.nonce)
	binary.BigEndian.PutUint32(b[16:20], m.route.QPN)
	binary.BigEndian.PutUint32(b[20:24], m.route.QKey)
	copy(b[24:40], m.route.GID[:])
	binary.BigEndian.PutUint16(b[40:42], m.route.LID)
	binary.BigEndian.PutUint16(b[42:44], uint16(m.route.MTU))
}

// privilegedQKey is a Q_Key's high bit: in a send it means "the QP's own
// Q_Key", so no peer may announce one.
const privilegedQKey = 1 << 31

// parseMsg reads a message from a peer, which is untrusted: anything but
// exactly msgSize bytes of a known kind, with a QPN a UD QP can have
// (24 bits, not the special QPs 0 and 1 nor the multicast QPN), a Q_Key
// without the privileged bit, a unicast GID and an MTU that is an IB MTU,
// is refused.
func parseMsg(b []byte) (msg, error) {
	if len(b) != msgSize || string(b[0:4]) != msgMagic || b[4] != msgVersion || (b[5] != kindReq && b[5] != kindAns) {
		return msg{}, errBadMsg
	}
	m := msg{kind: b[5], nonce: binary.BigEndian.Uint64(b[8:16])}
	m.route.QPN = binary.BigEndian.Uint32(b[16:20])
	m.route.QKey = binary.BigEndian.Uint32(b[20:24])
	m.route.GID = verbs.GID(b[24:40])
	m.route.LID = binary.BigEndian.Uint16(b[40:42])
	m.route.MTU = int(binary.BigEndian.Uint16(b[42:44]))
	if m.route.QPN < 2 || m.route.QPN >= verbs.MulticastQPN || m.route.QKey&privilegedQKey != 0 || m.route.GID.IsZero() || m.route.GID.IsMulticast() ||
		m.route.MTU == 0 || verbs.MTUFromBytes(m.route.MTU).Bytes() != m.route.MTU {
		return msg{}, errBadMsg
	}
	return m, nil
}
