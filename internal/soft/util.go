package soft

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

// inflight counts the provider goroutines that use an object (an MR being
// copied to, a QP being served). The object's Close first makes it
// unreachable, then waits for the count to drop to zero, so memory is
// never touched after deregistration. Acquire never blocks, so nested use
// by one goroutine cannot deadlock.
type inflight struct {
	n       atomic.Int64
	closing atomic.Bool
	zero    chan struct{}
}

func (f *inflight) init() { f.zero = make(chan struct{}, 1) }

func (f *inflight) acquire() { f.n.Add(1) }

func (f *inflight) release() {
	if f.n.Add(-1) == 0 && f.closing.Load() {
		select {
		case f.zero <- struct{}{}:
		default:
		}
	}
}

// drain waits until no goroutine holds the object. The object must
// already be unreachable (removed from its lookup table).
func (f *inflight) drain() {
	f.closing.Store(true)
	for f.n.Load() != 0 {
		<-f.zero
	}
}

// randKey is an unpredictable nonzero 32-bit key.
func randKey() uint32 {
	var b [4]byte
	for {
		_, _ = crand.Read(b[:]) // never fails (Go ≥ 1.24)
		if k := binary.LittleEndian.Uint32(b[:]); k != 0 {
			return k
		}
	}
}

// sgl is a resolved scatter/gather list: slices of registered memory,
// with a reference held on each MR until release.
type sgl struct {
	bufs [][]byte
	mrs  []*mr
	n    uint64
}

func newSGL(max int) sgl {
	return sgl{bufs: make([][]byte, 0, max), mrs: make([]*mr, 0, max)}
}

func (s *sgl) release() {
	for i, m := range s.mrs {
		m.refs.release()
		s.mrs[i] = nil
	}
	for i := range s.bufs {
		s.bufs[i] = nil
	}
	s.mrs = s.mrs[:0]
	s.bufs = s.bufs[:0]
	s.n = 0
}

// resolve checks sges against pd (lkey, range, and LOCAL_WRITE when write)
// and appends them to s. On failure s keeps what it resolved so far; the
// caller releases it.
func (s *sgl) resolve(p *pd, sges []verbs.SGE, write bool) bool {
	for _, e := range sges {
		if e.Length == 0 {
			continue
		}
		m := keys.lookup(e.LKey, false)
		if m == nil {
			return false
		}
		s.mrs = append(s.mrs, m)
		if m.pd != p || (write && m.access&verbs.AccessLocalWrite == 0) {
			return false
		}
		b, ok := m.slice(e.Addr, uint64(e.Length))
		if !ok {
			return false
		}
		s.bufs = append(s.bufs, b)
		s.n += uint64(e.Length)
	}
	return true
}

// scatter copies p into s starting at byte off of s.
func (s *sgl) scatter(off uint64, p []byte) {
	for _, b := range s.bufs {
		if len(p) == 0 {
			return
		}
		if off >= uint64(len(b)) {
			off -= uint64(len(b))
			continue
		}
		n := copy(b[off:], p)
		p = p[n:]
		off = 0
	}
}

// source is where a responder takes a message's payload from: the
// requester's memory in-process, or the TCP stream.
type source interface {
	// fill copies the next len(p) bytes of the payload into p.
	fill(p []byte) error
}

// sglSource reads a gather list in order.
type sglSource struct {
	s      *sgl
	buf    []byte // inline data, used instead of s when useBuf
	useBuf bool
	i      int
	off    int
}

func (g *sglSource) reset(s *sgl, inline []byte, useBuf bool) {
	g.s, g.buf, g.useBuf, g.i, g.off = s, inline, useBuf, 0, 0
}

func (g *sglSource) fill(p []byte) error {
	if g.useBuf {
		n := copy(p, g.buf[g.off:])
		g.off += n
		if n != len(p) {
			return io.ErrUnexpectedEOF
		}
		return nil
	}
	for len(p) > 0 {
		if g.i >= len(g.s.bufs) {
			return io.ErrUnexpectedEOF
		}
		n := copy(p, g.s.bufs[g.i][g.off:])
		p = p[n:]
		g.off += n
		if g.off == len(g.s.bufs[g.i]) {
			g.i++
			g.off = 0
		}
	}
	return nil
}

// streamSource reads a payload from a connection, with a deadline so a
// stalled peer cannot hold registered memory for ever.
type streamSource struct {
	c    *conn
	left uint64
}

func (s *streamSource) fill(p []byte) error {
	if uint64(len(p)) > s.left {
		return fmt.Errorf("%w: payload shorter than its message", errProtocol)
	}
	for len(p) > 0 {
		n := min(len(p), ioChunk)
		if s.c.rx.buffered() < n {
			s.c.armRead() // a read follows
		}
		err := s.c.rx.readFull(p[:n])
		s.left -= uint64(n)
		if err != nil {
			return streamErr("reading payload", err)
		}
		p = p[n:]
	}
	return nil
}

// discard skips what is left of the payload.
func (s *streamSource) discard() error {
	for s.left > 0 {
		n := min(s.left, ioChunk)
		if uint64(s.c.rx.buffered()) < n {
			s.c.armRead() // a read follows
		}
		err := s.c.rx.discard(n)
		s.left -= n
		if err != nil {
			return streamErr("skipping payload", err)
		}
	}
	return nil
}

// streamErr names an error in the middle of a frame: the end of the
// stream there means a truncated frame, a protocol error.
func streamErr(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated frame (%s): %w", errProtocol, what, err)
	}
	return fmt.Errorf("soft: %s: %w", what, err)
}

// atomicOp performs CAS or FAA on the 8-byte, 8-byte-aligned word at b
// and returns its old value. sync/atomic makes it atomic against every
// other atomic on the word, whichever peer or local QP issued it.
func atomicOp(b []byte, op verbs.Opcode, compareAdd, swap uint64) uint64 {
	p := (*uint64)(unsafe.Pointer(unsafe.SliceData(b)))
	if op == verbs.OpFetchAdd {
		return atomic.AddUint64(p, compareAdd) - compareAdd
	}
	for {
		old := atomic.LoadUint64(p)
		if old != compareAdd {
			return old
		}
		if atomic.CompareAndSwapUint64(p, old, swap) {
			return old
		}
	}
}

// rnrTable is the IB encoding of the RNR NAK timer, in microseconds.
var rnrTable = [32]uint32{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

const (
	minRNRDelay = 50 * time.Microsecond
	maxRNRDelay = 20 * time.Millisecond
)

// rnrDelay is the wait before retrying after an RNR NAK with timer t,
// bounded to [50 µs, 20 ms] so that tests stay fast and a waiting QP does
// not spin.
func rnrDelay(t uint8) time.Duration {
	d := time.Duration(rnrTable[t&31]) * time.Microsecond
	return min(max(d, minRNRDelay), maxRNRDelay)
}

// The bounds of a QP's timeout. Over TCP nothing is lost, so the timeout
// finds only a peer that stopped answering while its connection stayed
// up: a stopped process, or a host gone without a reset. A peer that is
// merely slow must not trip it: the hardware value go-rdma asks for
// (timeout 14, retry 7: 0.54 s) failed connections of the rxe VM's
// rdmacat test, whose emulated CPU stalled both of its processes for
// longer. Hence the floor of 2 s.
const (
	minTimeout = 2 * time.Second
	maxTimeout = 4 * time.Second
)

// ackTimeout is how long a requester waits for any progress on its
// outstanding WRs before it gives up with RETRY_EXC_ERR: 4.096 µs ·
// 2^timeout per try, RetryCount+1 tries, bounded to [2 s, 4 s]. A
// timeout of 0 ("wait for ever") also gets the bound, so a vanished peer
// is always reported.
func ackTimeout(timeout, retry uint8) time.Duration {
	if timeout == 0 || timeout >= 31 {
		return maxTimeout
	}
	d := time.Duration(4096<<timeout) * time.Nanosecond * time.Duration(int(retry&7)+1)
	return min(max(d, minTimeout), maxTimeout)
}
