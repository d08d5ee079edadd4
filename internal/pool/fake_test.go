package pool_test

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// fakeReg is a Registrar that records registrations. It refuses memory
// that internal/mem did not map (as the providers do), and fails with an
// error wrapping verbs.ErrMemlock past limit bytes, as a provider does
// past RLIMIT_MEMLOCK.
type fakeReg struct {
	mu        sync.Mutex
	limit     int64 // 0: none
	live      int64 // bytes registered now
	regs      []int // sizes of successful registrations, in order
	deregs    int
	key       uint32
	failDereg bool // MR.Close fails
	mrs       map[*fakeMR]bool
}

func newFakeReg() *fakeReg { return &fakeReg{mrs: map[*fakeMR]bool{}} }

func (f *fakeReg) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("fake: %w: zero-length region", verbs.ErrInvalid)
	}
	if err := mem.Check(buf); err != nil {
		return nil, fmt.Errorf("fake: register %d bytes: %w: %v", len(buf), verbs.ErrInvalid, err)
	}
	if access != verbs.AccessLocalWrite {
		return nil, fmt.Errorf("fake: pool asked for %v, want LOCAL_WRITE only", access)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.limit > 0 && f.live+int64(len(buf)) > f.limit {
		return nil, fmt.Errorf("fake: register %d bytes: %w: RLIMIT_MEMLOCK is %d KiB; raise it with `ulimit -l unlimited`",
			len(buf), verbs.ErrMemlock, f.limit/1024)
	}
	f.key++
	m := &fakeMR{f: f, buf: buf, key: f.key}
	f.live += int64(len(buf))
	f.regs = append(f.regs, len(buf))
	f.mrs[m] = true
	return m, nil
}

func (f *fakeReg) stats() (regs, deregs int, live int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.regs), f.deregs, f.live
}

// keyFor returns the key of the live MR covering addr, or 0.
func (f *fakeReg) keyFor(addr uint64) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	for m := range f.mrs {
		if addr >= m.Addr() && addr < m.Addr()+uint64(len(m.buf)) {
			return m.key
		}
	}
	return 0
}

type fakeMR struct {
	f      *fakeReg
	buf    []byte
	key    uint32
	closed bool
}

var errDereg = errors.New("fake: dereg failed")

func (m *fakeMR) LKey() uint32         { return m.key }
func (m *fakeMR) RKey() uint32         { return m.key }
func (m *fakeMR) Addr() uint64         { return uint64(uintptr(unsafe.Pointer(&m.buf[0]))) }
func (m *fakeMR) Len() int             { return len(m.buf) }
func (m *fakeMR) Bytes() []byte        { return m.buf }
func (m *fakeMR) Access() verbs.Access { return verbs.AccessLocalWrite }
func (m *fakeMR) Close() error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if m.closed {
		return nil
	}
	if m.f.failDereg {
		return errDereg
	}
	m.closed = true
	m.f.live -= int64(len(m.buf))
	m.f.deregs++
	delete(m.f.mrs, m)
	return nil
}
