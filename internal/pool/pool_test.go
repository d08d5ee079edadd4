package pool_test

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	kib = 1 << 10
	mib = 1 << 20
)

// newPool makes a pool over a fake registrar. At the end of the test it
// closes the pool and checks that every registration was undone and
// every mapping unmapped.
func newPool(t *testing.T, opts pool.Options) (*pool.Pool, *fakeReg) {
	t.Helper()
	start := mem.Mapped()
	f := newFakeReg()
	p, err := pool.New(f, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close at cleanup: %v", err)
		}
		checkDrained(t, p, f, start)
	})
	return p, f
}

func checkDrained(t *testing.T, p *pool.Pool, f *fakeReg, start int) {
	t.Helper()
	select {
	case <-p.Drained():
	default:
		t.Errorf("Drained not closed: %+v", p.Stats())
	}
	if n := mem.Mapped(); n != start {
		t.Errorf("mem.Mapped() = %d, was %d before the pool: mappings leaked", n, start)
	}
	regs, deregs, live := f.stats()
	if regs != deregs || live != 0 {
		t.Errorf("registrations %d, deregistrations %d, %d bytes still registered", regs, deregs, live)
	}
	st := p.Stats()
	if st.Slabs != 0 || st.BytesRegistered != 0 || st.BuffersInUse != 0 || st.BytesInUse != 0 {
		t.Errorf("Stats after Close = %+v, want all zero", st)
	}
}

func mustGet(t testing.TB, p *pool.Pool, n int) *pool.Buffer {
	t.Helper()
	b, err := p.Get(n)
	if err != nil {
		t.Fatalf("Get(%d): %v", n, err)
	}
	return b
}

func mustRelease(t testing.TB, b *pool.Buffer) {
	t.Helper()
	if err := b.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func TestSizeClasses(t *testing.T) {
	p, f := newPool(t, pool.Options{})
	page := mem.PageSize
	for _, tc := range []struct{ n, cap int }{
		{1, 64}, {8, 64}, {64, 64}, {65, 128}, {100, 128}, {1000, 1024},
		{4096, 4096}, {4097, 8192}, {64 * kib, 64 * kib}, {64*kib + 1, 128 * kib},
		{mib, mib}, {3 * mib, 4 * mib}, {4 * mib, 4 * mib},
		{4*mib + 1, 4*mib + page}, {5*mib - 3, 5 * mib},
	} {
		b := mustGet(t, p, tc.n)
		if b.Len() != tc.n || b.Cap() != tc.cap {
			t.Errorf("Get(%d): Len %d Cap %d, want %d and %d", tc.n, b.Len(), b.Cap(), tc.n, tc.cap)
		}
		buf := b.Bytes()
		if len(buf) != tc.n || cap(buf) != tc.n {
			t.Errorf("Get(%d): Bytes has len %d cap %d", tc.n, len(buf), cap(buf))
		}
		if err := mem.Check(buf); err != nil {
			t.Errorf("Get(%d): Bytes not off-heap: %v", tc.n, err)
		}
		if b.Addr()%64 != 0 || (tc.cap >= page && b.Addr()%uint64(page) != 0) {
			t.Errorf("Get(%d): address %#x badly aligned", tc.n, b.Addr())
		}
		if want := f.keyFor(b.Addr()); b.LKey() != want || want == 0 {
			t.Errorf("Get(%d): LKey %d, the covering MR has %d", tc.n, b.LKey(), want)
		}
		if b.Pool() != p {
			t.Errorf("Get(%d): Pool() is not the pool", tc.n)
		}
		for i := range buf { // the whole buffer is writable
			buf[i] = byte(i)
		}
		mustRelease(t, b)
	}
	if st := p.Stats(); st.BuffersInUse != 0 || st.BytesInUse != 0 {
		t.Errorf("after releasing everything: %+v", st)
	}
}

func TestSlabSizeRounding(t *testing.T) {
	for _, tc := range []struct{ in, want int }{
		{0, pool.DefaultSlabSize}, {1, mem.PageSize}, {100_000, 128 * kib}, {mib, mib},
	} {
		p, err := pool.New(newFakeReg(), pool.Options{SlabSize: tc.in})
		if err != nil {
			t.Fatal(err)
		}
		if p.SlabSize() != tc.want {
			t.Errorf("SlabSize %d: got %d, want %d", tc.in, p.SlabSize(), tc.want)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	f := newFakeReg()
	for _, tc := range []struct {
		name string
		reg  pool.Registrar
		opts pool.Options
	}{
		{"nil registrar", nil, pool.Options{}},
		{"negative slab", f, pool.Options{SlabSize: -1}},
		{"huge slab", f, pool.Options{SlabSize: 1 << 40}},
		{"negative MaxBytes", f, pool.Options{MaxBytes: -1}},
		{"MaxBytes below a slab", f, pool.Options{SlabSize: mib, MaxBytes: mib - 1}},
	} {
		if _, err := pool.New(tc.reg, tc.opts); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("New(%s) = %v, want ErrInvalid", tc.name, err)
		}
	}
	p, _ := newPool(t, pool.Options{})
	for _, n := range []int{0, -1, math.MinInt, math.MaxInt} {
		if b, err := p.Get(n); !errors.Is(err, verbs.ErrInvalid) || b != nil {
			t.Errorf("Get(%d) = %v, %v; want ErrInvalid", n, b, err)
		}
	}
	// A nil *Buffer gives errors, never a panic.
	var nb *pool.Buffer
	if nb.Live() || nb.Len() != 0 || nb.Cap() != 0 || nb.Bytes() != nil || nb.Addr() != 0 || nb.LKey() != 0 || nb.Pool() != nil {
		t.Error("nil Buffer accessors are not zero")
	}
	for name, err := range map[string]error{"Ref": nb.Ref(), "Unref": nb.Unref(), "Release": nb.Release(), "SetLen": nb.SetLen(0)} {
		if err == nil {
			t.Errorf("nil Buffer %s succeeded", name)
		}
	}
	if _, err := nb.Slice(0, 1); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("nil Buffer Slice: %v", err)
	}
	if _, err := (pool.Span{}).Slice(0, 1); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("zero Span Slice: %v", err)
	}
}

func TestLazyRegistration(t *testing.T) {
	start := mem.Mapped()
	p, f := newPool(t, pool.Options{SlabSize: mib})
	if regs, _, _ := f.stats(); regs != 0 || mem.Mapped() != start || p.Stats().Slabs != 0 {
		t.Fatalf("New registered %d slabs and mapped %d", regs, mem.Mapped()-start)
	}
	var held []*pool.Buffer
	get := func(n int) *pool.Buffer {
		b := mustGet(t, p, n)
		held = append(held, b)
		return b
	}
	first := get(64)
	if regs, _, _ := f.stats(); regs != 1 || f.regs[0] != mib {
		t.Fatalf("after the first Get: registrations %v, want one of %d bytes", f.regs, mib)
	}
	// Different size classes share the slab: 64, 128, 4 KiB and 64 KiB
	// classes take a 64 KiB run each.
	for _, n := range []int{100, 4096, 64 * kib} {
		if b := get(n); b.LKey() != first.LKey() {
			t.Errorf("Get(%d) came from another registration", n)
		}
	}
	// 12 more 64 KiB buffers fill the 16 runs of the slab.
	for range 12 {
		get(64 * kib)
	}
	for range 1000 { // and the 64 B class still has room in its run
		get(64)
	}
	if regs, _, _ := f.stats(); regs != 1 {
		t.Fatalf("%d registrations before the slab was full, want 1", regs)
	}
	if b := get(64 * kib); b.LKey() == first.LKey() {
		t.Error("a full slab handed out another buffer")
	}
	if regs, _, _ := f.stats(); regs != 2 || mem.Mapped() != start+2 {
		t.Errorf("after the slab filled: %d registrations, %d mappings; want 2 and 2", regs, mem.Mapped()-start)
	}
	for _, b := range held {
		mustRelease(t, b)
	}
	// Recycled buffers need no new registration.
	for range 100 {
		b := mustGet(t, p, 64*kib)
		mustRelease(t, b)
	}
	if regs, _, _ := f.stats(); regs != 2 {
		t.Errorf("reuse registered again: %d registrations", regs)
	}
}

func TestReleaseWhileReferenced(t *testing.T) {
	p, _ := newPool(t, pool.Options{})
	b := mustGet(t, p, 100)
	addr := b.Addr()
	if err := b.Ref(); err != nil { // an operation is posted
		t.Fatal(err)
	}
	mustRelease(t, b) // the owner lets go before the completion
	if b.Live() || b.Bytes() != nil {
		t.Error("released buffer is still live")
	}
	if err := b.Ref(); !errors.Is(err, pool.ErrReleased) {
		t.Errorf("Ref after Release = %v, want ErrReleased", err)
	}
	if st := p.Stats(); st.BuffersInUse != 1 || st.BytesInUse != 128 {
		t.Errorf("buffer referenced by an operation not counted: %+v", st)
	}
	// The memory is not reused while the operation holds it.
	c := mustGet(t, p, 100)
	if c.Addr() == addr {
		t.Fatal("Get handed out memory an operation still uses")
	}
	mustRelease(t, c)
	if err := b.Unref(); err != nil { // the completion arrives
		t.Fatal(err)
	}
	if st := p.Stats(); st.BuffersInUse != 0 {
		t.Errorf("after the last Unref: %+v", st)
	}
	if d := mustGet(t, p, 100); d.Addr() != addr {
		t.Errorf("the freed buffer was not reused (LIFO): got %#x, want %#x", d.Addr(), addr)
	} else {
		mustRelease(t, d)
	}

	// Several operations: the buffer returns after the last one, in
	// whatever order owner and operations let go.
	b = mustGet(t, p, 100)
	for range 3 {
		if err := b.Ref(); err != nil {
			t.Fatal(err)
		}
	}
	b.Unref()
	mustRelease(t, b)
	b.Unref()
	if p.Stats().BuffersInUse != 1 {
		t.Error("buffer returned with one operation still running")
	}
	b.Unref()
	if p.Stats().BuffersInUse != 0 {
		t.Error("buffer not returned after the last Unref")
	}
}

func TestDoubleRelease(t *testing.T) {
	p, _ := newPool(t, pool.Options{})
	b := mustGet(t, p, 10)
	other := mustGet(t, p, 10)
	mustRelease(t, b)
	before := p.Stats()
	if err := b.Release(); !errors.Is(err, pool.ErrReleased) {
		t.Errorf("second Release = %v, want ErrReleased", err)
	}
	if after := p.Stats(); after != before {
		t.Errorf("second Release changed the stats: %+v -> %+v", before, after)
	}
	if _, err := b.Slice(0, 1); !errors.Is(err, pool.ErrReleased) {
		t.Errorf("Slice after Release = %v", err)
	}
	if err := b.SetLen(1); !errors.Is(err, pool.ErrReleased) {
		t.Errorf("SetLen after Release = %v", err)
	}
	if err := b.Unref(); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("Unref without Ref = %v, want ErrInvalid", err)
	}
	// The free list holds b once: two Gets give two different buffers.
	x, y := mustGet(t, p, 10), mustGet(t, p, 10)
	if x == y || x.Addr() == y.Addr() || x.Addr() == other.Addr() || y.Addr() == other.Addr() {
		t.Error("a double Release handed one buffer out twice")
	}
	for _, b := range []*pool.Buffer{x, y, other} {
		mustRelease(t, b)
	}
	if st := p.Stats(); st.BuffersInUse != 0 {
		t.Errorf("in use after releasing everything: %+v", st)
	}
}

func TestUnrefWithoutRefKeepsOwner(t *testing.T) {
	p, _ := newPool(t, pool.Options{})
	b := mustGet(t, p, 10)
	if err := b.Unref(); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("Unref without Ref = %v", err)
	}
	if !b.Live() || p.Stats().BuffersInUse != 1 {
		t.Error("a stray Unref freed an owned buffer")
	}
	mustRelease(t, b)
}

func TestSlice(t *testing.T) {
	p, _ := newPool(t, pool.Options{})
	b := mustGet(t, p, 100)
	for i := range b.Bytes() {
		b.Bytes()[i] = byte(i)
	}
	for _, tc := range []struct{ off, n int }{{0, 100}, {10, 20}, {99, 1}, {0, 1}} {
		s, err := b.Slice(tc.off, tc.n)
		if err != nil {
			t.Errorf("Slice(%d, %d): %v", tc.off, tc.n, err)
			continue
		}
		if s.Buffer() != b || s.Offset() != tc.off || s.Len() != tc.n || s.Addr() != b.Addr()+uint64(tc.off) || s.LKey() != b.LKey() {
			t.Errorf("Slice(%d, %d) = off %d len %d addr %#x", tc.off, tc.n, s.Offset(), s.Len(), s.Addr())
		}
		if got := s.Bytes(); len(got) != tc.n || cap(got) != tc.n || got[0] != byte(tc.off) {
			t.Errorf("Slice(%d, %d).Bytes() wrong: len %d", tc.off, tc.n, len(got))
		}
	}
	for _, tc := range []struct{ off, n int }{
		{-1, 1}, {0, 0}, {0, -1}, {0, 101}, {100, 1}, {101, 0}, {50, 51},
		{math.MaxInt, 1}, {1, math.MaxInt}, {math.MinInt, 2}, {2, math.MinInt},
	} {
		if _, err := b.Slice(tc.off, tc.n); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("Slice(%d, %d) = %v, want ErrInvalid", tc.off, tc.n, err)
		}
	}
	// Nested spans stay inside their parent.
	s, _ := b.Slice(10, 20)
	in, err := s.Slice(5, 15)
	if err != nil || in.Offset() != 15 || in.Len() != 15 || in.Bytes()[0] != 15 {
		t.Errorf("nested Slice: %+v %v", in, err)
	}
	if _, err := s.Slice(5, 16); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("nested Slice past the parent: %v", err)
	}
	if whole := b.Span(); whole.Len() != 100 || whole.Addr() != b.Addr() {
		t.Errorf("Span() = %+v", whole)
	}
	// SetLen moves the bound Slice checks against.
	if err := b.SetLen(128); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Slice(100, 28); err != nil {
		t.Errorf("Slice inside the new length: %v", err)
	}
	if err := b.SetLen(129); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("SetLen past Cap = %v", err)
	}
	if err := b.SetLen(-1); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("SetLen(-1) = %v", err)
	}
	if err := b.SetLen(0); err != nil || len(b.Bytes()) != 0 {
		t.Errorf("SetLen(0): %v", err)
	}
	mustRelease(t, b)
	if s.Bytes() != nil {
		t.Error("Span.Bytes after Release is not nil")
	}
	if _, err := s.Slice(0, 1); !errors.Is(err, pool.ErrReleased) {
		t.Errorf("Span.Slice after Release = %v", err)
	}
}

func TestStats(t *testing.T) {
	p, _ := newPool(t, pool.Options{SlabSize: 64 * kib, LargeCache: 1})
	if st := p.Stats(); st != (pool.Stats{}) {
		t.Fatalf("fresh pool: %+v", st)
	}
	a := mustGet(t, p, 100)       // class 128, slab 1
	b := mustGet(t, p, 64*kib)    // class 64 KiB, slab 2
	c := mustGet(t, p, 100*kib+1) // large, 100 KiB + a page
	large := int64(c.Cap())
	want := pool.Stats{Slabs: 3, BytesRegistered: 128*kib + large, BuffersInUse: 3, BytesInUse: 128 + 64*kib + large, Registrations: 3}
	if st := p.Stats(); st != want {
		t.Errorf("Stats = %+v, want %+v", st, want)
	}
	c.Ref()
	mustRelease(t, c)
	if st := p.Stats(); st.BuffersInUse != 3 {
		t.Errorf("referenced large buffer not counted: %+v", st)
	}
	c.Unref() // goes to the large cache: still registered
	want = pool.Stats{Slabs: 3, BytesRegistered: 128*kib + large, BuffersInUse: 2, BytesInUse: 128 + 64*kib, Registrations: 3}
	if st := p.Stats(); st != want {
		t.Errorf("Stats = %+v, want %+v", st, want)
	}
	mustRelease(t, a)
	mustRelease(t, b)
	if st := p.Stats(); st.BuffersInUse != 0 || st.BytesInUse != 0 {
		t.Errorf("after releasing everything: %+v", st)
	}
	if err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	want = pool.Stats{Registrations: 3, Deregistrations: 3}
	if st := p.Stats(); st != want {
		t.Errorf("after Trim: %+v, want %+v", st, want)
	}
}

func TestLargeBuffers(t *testing.T) {
	start := mem.Mapped()
	p, f := newPool(t, pool.Options{SlabSize: 64 * kib, LargeCache: 1})
	a := mustGet(t, p, 100*kib)
	if a.Cap() != 100*kib || mem.Mapped() != start+1 {
		t.Fatalf("large buffer: Cap %d, %d mappings", a.Cap(), mem.Mapped()-start)
	}
	addr := a.Addr()
	mustRelease(t, a) // cached
	if regs, deregs, _ := f.stats(); regs != 1 || deregs != 0 {
		t.Fatalf("cached large buffer was deregistered: %d/%d", regs, deregs)
	}
	b := mustGet(t, p, 90*kib) // served from the cache
	if b.Addr() != addr || b.Len() != 90*kib || b.Cap() != 100*kib {
		t.Errorf("cache not used: addr %#x want %#x, len %d", b.Addr(), addr, b.Len())
	}
	c := mustGet(t, p, 100*kib) // cache empty: a new registration
	mustRelease(t, b)           // cached
	mustRelease(t, c)           // cache full: freed
	if regs, deregs, _ := f.stats(); regs != 2 || deregs != 1 || mem.Mapped() != start+1 {
		t.Errorf("registrations %d, deregistrations %d, mappings %d; want 2, 1, 1", regs, deregs, mem.Mapped()-start)
	}
	d := mustGet(t, p, 300*kib) // the cached 100 KiB is too small
	e := mustGet(t, p, 65*kib)  // 100 KiB is more than twice too big? no: at most twice, so used
	if d.Addr() == addr || e.Addr() != addr {
		t.Errorf("cache fit: 300 KiB at %#x, 65 KiB at %#x, cached %#x", d.Addr(), e.Addr(), addr)
	}
	mustRelease(t, d)
	mustRelease(t, e)

	// With the cache off a large buffer is freed at once.
	start2 := mem.Mapped()
	q, g := newPool(t, pool.Options{SlabSize: 64 * kib, LargeCache: -1})
	x := mustGet(t, q, mib)
	x.Ref()
	mustRelease(t, x)
	if mem.Mapped() != start2+1 {
		t.Error("large buffer freed under an operation")
	}
	x.Unref()
	if regs, deregs, _ := g.stats(); regs != 1 || deregs != 1 || mem.Mapped() != start2 {
		t.Errorf("uncached large buffer not freed: %d/%d, %d mappings", regs, deregs, mem.Mapped()-start2)
	}
}

func TestLargeCacheFit(t *testing.T) {
	p, f := newPool(t, pool.Options{SlabSize: 64 * kib, LargeCache: 1})
	a := mustGet(t, p, 400*kib)
	mustRelease(t, a)
	b := mustGet(t, p, 100*kib) // less than half of 400 KiB: not from the cache
	if b.Addr() == a.Addr() {
		t.Error("a 100 KiB request took a 400 KiB cached buffer")
	}
	mustRelease(t, b) // cache full: freed
	if regs, deregs, _ := f.stats(); regs != 2 || deregs != 1 {
		t.Errorf("registrations %d, deregistrations %d", regs, deregs)
	}
}

func TestMaxBytes(t *testing.T) {
	p, _ := newPool(t, pool.Options{SlabSize: 64 * kib, MaxBytes: 256 * kib, LargeCache: -1})
	var bufs []*pool.Buffer
	for range 4 { // one whole slab each
		bufs = append(bufs, mustGet(t, p, 64*kib))
	}
	_, err := p.Get(64)
	if !errors.Is(err, pool.ErrLimit) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("Get past MaxBytes = %v, want ErrLimit naming the limit", err)
	}
	if _, err := p.Get(300 * kib); !errors.Is(err, pool.ErrLimit) {
		t.Errorf("large Get past MaxBytes = %v", err)
	}
	if st := p.Stats(); st.BytesRegistered != 256*kib || st.BuffersInUse != 4 {
		t.Errorf("failed Gets changed the stats: %+v", st)
	}
	// An idle slab of another class is freed to make room.
	mustRelease(t, bufs[0])
	b, err := p.Get(64)
	if err != nil {
		t.Fatalf("Get after freeing a slab: %v", err)
	}
	if st := p.Stats(); st.Slabs != 4 || st.Deregistrations != 1 || st.BytesRegistered != 256*kib {
		t.Errorf("Stats = %+v", st)
	}
	mustRelease(t, b)
	for _, b := range bufs[1:] {
		mustRelease(t, b)
	}
	// Everything idle: a large buffer fits after trimming.
	l, err := p.Get(200 * kib)
	if err != nil {
		t.Fatalf("large Get with idle slabs: %v", err)
	}
	mustRelease(t, l)
}

func TestMemlockError(t *testing.T) {
	start := mem.Mapped()
	p, f := newPool(t, pool.Options{SlabSize: 64 * kib})
	f.limit = 128 * kib
	a, b := mustGet(t, p, 64*kib), mustGet(t, p, 64*kib)
	_, err := p.Get(64 * kib)
	if !errors.Is(err, verbs.ErrMemlock) {
		t.Fatalf("Get past the memlock limit = %v, want ErrMemlock", err)
	}
	for _, s := range []string{"pool:", "65536-byte slab", "131072 bytes already registered", "RLIMIT_MEMLOCK", "ulimit -l"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if mem.Mapped() != start+2 {
		t.Errorf("failed registration left its mapping: %d mappings, want 2", mem.Mapped()-start)
	}
	if _, err := p.Get(200 * kib); !errors.Is(err, verbs.ErrMemlock) {
		t.Errorf("large Get past the memlock limit = %v", err)
	}
	mustRelease(t, a)
	mustRelease(t, b)
}

func TestTrim(t *testing.T) {
	start := mem.Mapped()
	p, f := newPool(t, pool.Options{SlabSize: 64 * kib})
	keep := mustGet(t, p, 64*kib) // slab 1, in use
	idle := mustGet(t, p, 100)    // slab 2
	mustRelease(t, idle)
	if err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	if regs, deregs, _ := f.stats(); regs != 2 || deregs != 1 || mem.Mapped() != start+1 {
		t.Errorf("Trim: %d/%d, %d mappings", regs, deregs, mem.Mapped()-start)
	}
	// The trimmed class works again, from a new slab.
	again := mustGet(t, p, 100)
	again.Bytes()[0] = 1
	mustRelease(t, again)
	mustRelease(t, keep)
}

func TestCloseWithBuffersInUse(t *testing.T) {
	start := mem.Mapped()
	f := newFakeReg()
	p, err := pool.New(f, pool.Options{SlabSize: 64 * kib})
	if err != nil {
		t.Fatal(err)
	}
	owned := mustGet(t, p, 100)       // the owner still holds it
	inflight := mustGet(t, p, 64*kib) // an operation holds it
	large := mustGet(t, p, 100*kib)
	idle := mustGet(t, p, 4096) // 64 KiB runs: each class has a slab
	mustRelease(t, idle)
	inflight.Ref()
	mustRelease(t, inflight)
	gone := mustGet(t, p, 64*kib) // a slab of its own, idle at Close
	mustRelease(t, gone)

	err = p.Close()
	if !errors.Is(err, verbs.ErrBusy) || !strings.Contains(err.Error(), "3 buffers") {
		t.Fatalf("Close with 3 buffers in use = %v, want ErrBusy counting 3", err)
	}
	if _, err := p.Get(10); !errors.Is(err, pool.ErrClosed) || !errors.Is(err, net.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
	if _, err := p.Get(mib); !errors.Is(err, pool.ErrClosed) {
		t.Errorf("large Get after Close = %v, want ErrClosed", err)
	}
	// The idle slabs are gone; the memory under the buffers is not.
	if _, deregs, _ := f.stats(); deregs != 2 || mem.Mapped() != start+3 {
		t.Errorf("Close freed %d slabs, %d mappings left; want 2 and 3", deregs, mem.Mapped()-start)
	}
	owned.Bytes()[99] = 1 // still mapped and writable
	select {
	case <-p.Drained():
		t.Fatal("Drained closed with buffers in use")
	default:
	}
	if err := p.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("second Close = %v, want ErrBusy", err)
	}
	mustRelease(t, owned)
	mustRelease(t, large)
	if mem.Mapped() != start+1 {
		t.Errorf("%d mappings after the owners released, want 1 (the in-flight one)", mem.Mapped()-start)
	}
	inflight.Unref() // the completion arrives: the last slab goes
	checkDrained(t, p, f, start)
	if err := p.Close(); err != nil {
		t.Errorf("Close after everything was released = %v", err)
	}
}

func TestCloseIdle(t *testing.T) {
	start := mem.Mapped()
	f := newFakeReg()
	p, err := pool.New(f, pool.Options{SlabSize: 64 * kib})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{64, 5000, 64 * kib, 200 * kib, 300 * kib, 400 * kib} {
		mustRelease(t, mustGet(t, p, n))
	}
	for range 2 {
		if err := p.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		checkDrained(t, p, f, start)
	}
	if err := p.Trim(); err != nil {
		t.Errorf("Trim after Close: %v", err)
	}
}

func TestCloseUnused(t *testing.T) {
	start := mem.Mapped()
	f := newFakeReg()
	p, err := pool.New(f, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	checkDrained(t, p, f, start)
}

func TestDeregFailure(t *testing.T) {
	start := mem.Mapped()
	f := newFakeReg()
	p, err := pool.New(f, pool.Options{SlabSize: 64 * kib})
	if err != nil {
		t.Fatal(err)
	}
	mustRelease(t, mustGet(t, p, 64))
	f.failDereg = true
	err = p.Close()
	if !errors.Is(err, errDereg) || !strings.Contains(err.Error(), "left mapped") {
		t.Errorf("Close with a failing deregistration = %v", err)
	}
	// The device might still use memory it could not deregister, so it
	// stays mapped; Drained still closes (nothing more to do).
	if mem.Mapped() != start+1 {
		t.Errorf("memory unmapped although deregistration failed")
	}
	if st := p.Stats(); st.Slabs != 1 || st.BytesRegistered != 64*kib {
		t.Errorf("Stats hide the registration left behind: %+v", st)
	}
	<-p.Drained()
	// Clean up behind the pool.
	f.failDereg = false
	for m := range f.mrs {
		m.Close()
		if err := mem.Unmap(m.buf); err != nil {
			t.Fatal(err)
		}
	}
}

// TestConcurrent runs owners and a "poller" on many goroutines. Owners
// fill their buffer with a tag, post operations (Ref) whose completions
// the poller delivers (Unref) after checking the tag, and release either
// before or after the completion. Any reuse of memory that is still
// referenced breaks a tag.
func TestConcurrent(t *testing.T) {
	p, f := newPool(t, pool.Options{SlabSize: 64 * kib, LargeCache: 1})
	type op struct {
		b   *pool.Buffer
		mem []byte // what the "NIC" reads: captured at post time
		tag byte
	}
	ops := make(chan op, 64)
	var pollers sync.WaitGroup
	var bad sync.Once
	fail := func(format string, args ...any) { bad.Do(func() { t.Errorf(format, args...) }) }
	for range 2 {
		pollers.Add(1)
		go func() {
			defer pollers.Done()
			for o := range ops {
				for i, c := range o.mem {
					if c != o.tag {
						fail("memory reused under an operation: byte %d is %d, want %d", i, c, o.tag)
						break
					}
				}
				if err := o.b.Unref(); err != nil {
					fail("Unref: %v", err)
				}
			}
		}()
	}
	const workers, iters = 8, 1500
	var owners sync.WaitGroup
	for w := range workers {
		owners.Add(1)
		go func() {
			defer owners.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			sizes := []int{8, 64, 100, 1000, 4096, 9000, 64 * kib, 70 * kib}
			for i := range iters {
				n := sizes[r.IntN(len(sizes))]
				if r.IntN(50) == 0 {
					n = 64*kib + 1 + r.IntN(200*kib) // large
				}
				b, err := p.Get(n)
				if err != nil {
					fail("Get(%d): %v", n, err)
					return
				}
				tag := byte(w*iters + i)
				buf := b.Bytes()
				for j := range buf {
					buf[j] = tag
				}
				nops := r.IntN(3)
				for range nops {
					if err := b.Ref(); err != nil {
						fail("Ref: %v", err)
						return
					}
				}
				releaseFirst := r.IntN(2) == 0
				if releaseFirst {
					if err := b.Release(); err != nil {
						fail("Release: %v", err)
					}
				}
				for range nops {
					ops <- op{b: b, mem: buf, tag: tag}
				}
				if !releaseFirst {
					for j, c := range buf {
						if c != tag {
							fail("owned memory changed: byte %d", j)
							break
						}
					}
					if err := b.Release(); err != nil {
						fail("Release: %v", err)
					}
				}
				if s := r.IntN(20); s == 0 {
					_ = p.Stats()
				} else if s == 1 {
					if err := p.Trim(); err != nil {
						fail("Trim: %v", err)
					}
				}
			}
		}()
	}
	owners.Wait()
	close(ops)
	pollers.Wait()
	if st := p.Stats(); st.BuffersInUse != 0 || st.BytesInUse != 0 {
		t.Errorf("after every release and completion: %+v", st)
	}
	if regs, _, _ := f.stats(); regs == 0 {
		t.Error("no registrations?")
	}
}

// TestCloseDuringUse closes the pool while goroutines Get, Ref, Release
// and Unref. Nothing may be freed under a reference, and once every
// goroutine has let go everything must be freed.
func TestCloseDuringUse(t *testing.T) {
	start := mem.Mapped()
	f := newFakeReg()
	p, err := pool.New(f, pool.Options{SlabSize: 64 * kib})
	if err != nil {
		t.Fatal(err)
	}
	const workers = 6
	var started, done sync.WaitGroup
	started.Add(workers)
	for w := range workers {
		done.Add(1)
		go func() {
			defer done.Done()
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for i := 0; ; i++ {
				if i == 100 {
					started.Done()
				}
				n := 2 + r.IntN(100*kib) // two distinct bytes to check
				b, err := p.Get(n)
				if err != nil {
					if !errors.Is(err, pool.ErrClosed) {
						t.Errorf("Get: %v", err)
					}
					if i < 100 {
						started.Done()
					}
					return
				}
				buf := b.Bytes()
				buf[0], buf[n-1] = 1, 2
				b.Ref()
				b.Release()
				if buf[0] != 1 || buf[n-1] != 2 {
					t.Errorf("memory changed under a reference (n=%d: %d %d)", n, buf[0], buf[n-1])
				}
				b.Unref()
			}
		}()
	}
	started.Wait()
	err = p.Close()
	if err != nil && !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("Close: %v", err)
	}
	done.Wait()
	if err := p.Close(); err != nil {
		t.Errorf("Close after the workers stopped: %v", err)
	}
	checkDrained(t, p, f, start)
}

func TestZeroAllocs(t *testing.T) {
	p, _ := newPool(t, pool.Options{SlabSize: 64 * kib})
	for _, n := range []int{8, 100, 4096, 64 * kib, 100 * kib} {
		mustRelease(t, mustGet(t, p, n)) // warm: chunk and cache exist
		if a := testing.AllocsPerRun(1000, func() {
			b, _ := p.Get(n)
			b.Release()
		}); a != 0 {
			t.Errorf("Get(%d)+Release: %v allocs, want 0", n, a)
		}
	}
	if a := testing.AllocsPerRun(1000, func() {
		b, _ := p.Get(256)
		b.Ref()
		s, _ := b.Slice(10, 20)
		_ = s.Addr() + uint64(s.LKey())
		b.Release()
		b.Unref()
	}); a != 0 {
		t.Errorf("Get+Ref+Slice+Release+Unref: %v allocs, want 0", a)
	}
}

// Rule: Get returns memory zero to its capacity, whatever earlier
// owners wrote, grew with SetLen or had filled by a receive; small and
// large (cached) buffers alike.
func TestZeroToCapacity(t *testing.T) {
	p, _ := newPool(t, pool.Options{SlabSize: 64 << 10})
	for _, n := range []int{10, 100, 32769, 200 << 10} {
		for _, grow := range []string{"SetLen", "Filled"} {
			b := mustGet(t, p, n)
			if grow == "SetLen" {
				require.NoError(t, b.SetLen(b.Cap()))
			} else {
				require.NoError(t, b.Filled(b.Cap()/2+1))
			}
			for i := range b.Bytes() {
				b.Bytes()[i] = 0xee
			}
			mustRelease(t, b)
			b = mustGet(t, p, n)
			require.NoError(t, b.SetLen(b.Cap()))
			require.Equal(t, b.Cap(), bytes.Count(b.Bytes(), []byte{0}), "Get(%d) after %s shows an earlier owner's bytes", n, grow)
			mustRelease(t, b)
		}
	}
}

// Rule: a receive buffer from GetReceive shows no earlier owner's byte
// once Filled: the bytes past the count the device wrote read as zero to
// the capacity, whether the earlier message was longer or shorter; a
// receive released unread (failed, taken back) leaves nothing for the
// next Get either. Small and large sizes alike.
func TestGetReceiveZeroPastFill(t *testing.T) {
	p, _ := newPool(t, pool.Options{SlabSize: 64 << 10})
	dirty := func(b *pool.Buffer, n int) {
		require.NoError(t, b.SetLen(n))
		for i := range b.Bytes() {
			b.Bytes()[i] = 0xee
		}
	}
	for _, size := range []int{100, 64 << 10, 200 << 10} {
		for _, c := range []struct{ before, fill int }{{size, 10}, {10, size}, {size, 0}, {size, size}} {
			b := mustGet(t, p, size)
			dirty(b, c.before) // an earlier owner's message
			mustRelease(t, b)
			b, err := p.GetReceive(size)
			require.NoError(t, err)
			dirty(b, c.fill) // the device writes the new one
			require.NoError(t, b.Filled(c.fill))
			require.NoError(t, b.SetLen(b.Cap()))
			got := b.Bytes()
			require.Equal(t, bytes.Repeat([]byte{0xee}, c.fill), got[:c.fill], "size %d: the message", size)
			require.Equal(t, b.Cap()-c.fill, bytes.Count(got[c.fill:], []byte{0}), "size %d, %d bytes before, %d filled: an earlier owner's bytes show", size, c.before, c.fill)
			mustRelease(t, b)
		}
		// Released unread after the device wrote it whole.
		b, err := p.GetReceive(size)
		require.NoError(t, err)
		dirty(b, size)
		mustRelease(t, b)
		b = mustGet(t, p, size)
		require.NoError(t, b.SetLen(b.Cap()))
		require.Equal(t, b.Cap(), bytes.Count(b.Bytes(), []byte{0}), "size %d: Get after an unread receive shows its bytes", size)
		mustRelease(t, b)
	}
}

// GetReceive leaves the memory as it was (the device overwrites it, and
// Filled clears what it does not): a 64 KiB SEND into a receive buffer
// whose last message was 64 KiB long clears nothing, where Get cleared
// 64 KiB. Before GetReceive, every re-posted receive was cleared.
func TestGetReceiveSkipsClear(t *testing.T) {
	p, _ := newPool(t, pool.Options{SlabSize: 64 << 10})
	b := mustGet(t, p, 64<<10)
	for i := range b.Bytes() {
		b.Bytes()[i] = 0xee
	}
	mustRelease(t, b)
	b, err := p.GetReceive(64 << 10)
	require.NoError(t, err)
	require.Equal(t, 64<<10, bytes.Count(b.Bytes(), []byte{0xee}), "GetReceive cleared the buffer")
	require.NoError(t, b.Filled(64<<10))
	mustRelease(t, b)
}

// Rule: with Decay, memory follows the load down. A slab idle from one
// look to the next and a cached large buffer not reused are freed; a
// slab in use stays, and so does one idle slab while buffers are in
// use. Once nothing is in use everything goes.
func TestDecay(t *testing.T) {
	const decay = 20 * time.Millisecond
	p, _ := newPool(t, pool.Options{SlabSize: 64 * kib, Decay: decay})
	keep := mustGet(t, p, 64*kib) // slab 1, in use throughout
	var idle []*pool.Buffer
	for range 3 {
		idle = append(idle, mustGet(t, p, 64*kib)) // slabs 2-4
	}
	mustRelease(t, mustGet(t, p, 100*kib)) // a cached large buffer
	for _, b := range idle {
		mustRelease(t, b)
	}
	require.Equal(t, 5, p.Stats().Slabs)
	require.Eventually(t, func() bool { return p.Stats().Slabs == 2 }, 10*time.Second, time.Millisecond,
		"idle slabs left: the one in use and one of headroom should stay; %+v", p.Stats())
	mustRelease(t, keep)
	require.Eventually(t, func() bool { return p.Stats().BytesRegistered == 0 }, 10*time.Second, time.Millisecond,
		"nothing in use and memory still registered: %+v", p.Stats())
}
