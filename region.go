package rdma

import (
	"encoding/binary"
	"fmt"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Access is a set of rights a peer gets on exposed memory.
type Access = verbs.Access

// Remote access rights for Expose and RequestRegion.
const (
	RemoteRead   Access = verbs.AccessRemoteRead
	RemoteWrite  Access = verbs.AccessRemoteWrite
	RemoteAtomic Access = verbs.AccessRemoteAtomic
)

// RemoteRegion names memory in the peer: Len bytes at the peer's virtual
// address Addr, reachable with RKey. An rkey is not a secret: whoever has
// the region can use it for as long as it is exposed.
type RemoteRegion struct {
	Addr uint64
	Len  int
	RKey uint32
}

// regionSize is the size of a marshaled RemoteRegion.
const regionSize = 8 + 8 + 4

// MarshalBinary encodes r in 20 bytes, big-endian.
func (r RemoteRegion) MarshalBinary() ([]byte, error) {
	return r.appendTo(make([]byte, 0, regionSize)), nil
}

func (r RemoteRegion) appendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Addr)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Len))
	return binary.BigEndian.AppendUint32(b, r.RKey)
}

// UnmarshalBinary decodes what MarshalBinary encoded.
func (r *RemoteRegion) UnmarshalBinary(b []byte) error {
	if len(b) != regionSize {
		return fmt.Errorf("rdma: remote region: %d bytes, want %d", len(b), regionSize)
	}
	n := binary.BigEndian.Uint64(b[8:])
	if n > 1<<48 {
		return fmt.Errorf("rdma: remote region: length %d out of range", n)
	}
	r.Addr = binary.BigEndian.Uint64(b)
	r.Len = int(n)
	r.RKey = binary.BigEndian.Uint32(b[16:])
	return nil
}

// Slice is the sub-region of n bytes at offset off.
func (r RemoteRegion) Slice(off, n int) (RemoteRegion, error) {
	if off < 0 || n < 0 || off > r.Len || n > r.Len-off {
		return RemoteRegion{}, fmt.Errorf("rdma: slice [%d:+%d] of a %d-byte remote region: %w", off, n, r.Len, ErrInvalid)
	}
	return RemoteRegion{Addr: r.Addr + uint64(off), Len: n, RKey: r.RKey}, nil
}

func (r RemoteRegion) String() string {
	return fmt.Sprintf("remote[%#x+%d rkey %#x]", r.Addr, r.Len, r.RKey)
}
