package soft

import (
	"fmt"
	"unsafe"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// mr is a registered memory region. Its keys are random; every access is
// checked against the PD, the range and the rights.
type mr struct {
	lt     verbs.Lifetime
	pd     *pd
	buf    []byte
	addr   uint64
	lkey   uint32
	rkey   uint32
	access verbs.Access
	refs   inflight
}

func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("soft: reg mr: %w: zero-length buffer", verbs.ErrInvalid)
	}
	if err := access.Validate(); err != nil {
		return nil, fmt.Errorf("soft: reg mr: %w", err)
	}
	if err := mem.Check(buf); err != nil {
		return nil, fmt.Errorf("soft: reg mr: %w: %w", verbs.ErrInvalid, err)
	}
	if err := p.lt.AddChild(); err != nil {
		return nil, errClosed("reg mr")
	}
	m := &mr{
		pd:     p,
		buf:    buf[:len(buf):len(buf)],
		addr:   uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		access: access,
	}
	m.refs.init()
	keys.add(m)
	return m, nil
}

func (m *mr) LKey() uint32                  { return m.lkey }
func (m *mr) RKey() uint32                  { return m.rkey }
func (m *mr) Addr() uint64                  { return m.addr }
func (m *mr) Len() int                      { return len(m.buf) }
func (m *mr) Bytes() []byte                 { return m.buf }
func (m *mr) Access() verbs.Access          { return m.access }
func (m *mr) String() string                { return fmt.Sprintf("soft MR %#x+%d", m.addr, len(m.buf)) }
func (m *mr) hasAccess(a verbs.Access) bool { return m.access&a == a }

// Close deregisters the MR. Operations already copying to or from it
// finish first; later ones fail their key check.
func (m *mr) Close() error {
	return m.lt.Close(func() error {
		keys.remove(m)
		m.refs.drain()
		m.pd.lt.DropChild()
		return nil
	})
}

// slice is the registered memory at [addr, addr+n), if all of it lies in
// the region.
func (m *mr) slice(addr, n uint64) ([]byte, bool) {
	if addr < m.addr {
		return nil, false
	}
	off := addr - m.addr
	if off > uint64(len(m.buf)) || n > uint64(len(m.buf))-off {
		return nil, false
	}
	return m.buf[off : off+n : off+n], true
}

// remoteSlice checks an incoming request against rkey, range and rights
// for QP q and returns the target memory, holding the MR. Caller holds
// q.mu.
func (q *qp) remoteSlice(rkey uint32, addr, n uint64, need verbs.Access) (*mr, []byte, bool) {
	if q.access&need != need {
		return nil, nil, false
	}
	m := q.rkeys.get(rkey, true)
	if m == nil {
		return nil, nil, false
	}
	if m.pd != q.pd || !m.hasAccess(need) {
		m.refs.release()
		return nil, nil, false
	}
	b, ok := m.slice(addr, n)
	if !ok {
		m.refs.release()
		return nil, nil, false
	}
	return m, b, true
}
