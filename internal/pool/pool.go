package pool

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Registrar registers memory. A verbs.PD satisfies it; tests pass fakes.
type Registrar interface {
	RegMR(buf []byte, access verbs.Access) (verbs.MR, error)
}

var (
	// ErrClosed is returned by Get after Close. It wraps net.ErrClosed.
	ErrClosed = fmt.Errorf("buffer pool closed: %w", net.ErrClosed)
	// ErrReleased: the buffer's owner already released it, so it cannot
	// be used for new operations, released again or sliced.
	ErrReleased = errors.New("buffer already released")
	// ErrLimit: a Get would register more than Options.MaxBytes.
	ErrLimit = errors.New("buffer pool limit reached")
)

const (
	// DefaultSlabSize is the slab size when Options.SlabSize is zero.
	DefaultSlabSize = 4 << 20
	// DefaultLargeCache is the number of freed large buffers kept
	// registered when Options.LargeCache is zero.
	DefaultLargeCache = 2

	minClassShift = 6 // 64-byte smallest class
	minClass      = 1 << minClassShift
	maxRunSize    = 64 << 10
	maxSlabSize   = 1 << 30
)

// Options configure a Pool. The zero value gives the defaults.
type Options struct {
	// SlabSize is the size of each registered slab, and of the largest
	// size class; larger requests get a dedicated mapping. It is rounded
	// up to a power of two of at least one page. Zero means 4 MiB.
	SlabSize int
	// MaxBytes bounds the bytes the pool has registered at once (slabs,
	// large buffers and the large-buffer cache). A Get that would pass it
	// first frees idle slabs (see Trim) and then fails with an error
	// wrapping ErrLimit. Zero means no bound of the pool's own;
	// RLIMIT_MEMLOCK still applies. It must not be less than SlabSize.
	MaxBytes int64
	// LargeCache is how many freed large buffers (bigger than SlabSize)
	// stay registered for reuse. Zero means 2; a negative value disables
	// the cache, so every large buffer is deregistered and unmapped when
	// it is freed.
	LargeCache int
	// Decay, when positive, gives memory back as the load falls: a
	// size-class slab that has held no buffer in use, or a cached large
	// buffer that has not been reused, from one look to the next (a
	// Decay apart) is deregistered and unmapped; while buffers are in
	// use one idle slab stays, as headroom. The timer runs only while
	// something idle is registered. Zero means only Trim and the
	// MaxBytes bound give memory back.
	Decay time.Duration
}

// Stats is a snapshot of a pool's accounting.
type Stats struct {
	// Slabs is the number of registered mappings: size-class slabs,
	// large buffers in use and cached large buffers.
	Slabs int
	// BytesRegistered is their total size.
	BytesRegistered int64
	// BuffersInUse counts the buffers that hold a reference, either the
	// owner's or an operation's.
	BuffersInUse int
	// BytesInUse is the capacity of those buffers (size class, or the
	// page-rounded size of a large buffer).
	BytesInUse int64
	// Registrations and Deregistrations count successful RegMR and
	// MR.Close calls over the pool's life.
	Registrations   uint64
	Deregistrations uint64
}

// slab is one registered mapping.
type slab struct {
	mem   []byte // from mem.Map; len == cap == size
	mr    verbs.MR
	base  uint64
	lkey  uint32
	next  int          // bump offset for runs; under Pool.slabMu
	used  atomic.Int32 // buffers of this slab holding a reference
	freed atomic.Bool  // deregistration started; set exactly once
	idle  atomic.Bool  // idle at the last decay look and not used since
}

// class is one size class. Its free list and current run are guarded by
// mu; Release takes only mu, so returning a buffer never waits for a
// registration.
type class struct {
	mu      sync.Mutex
	size    int
	runSize int
	free    *Buffer // LIFO, linked through Buffer.next
	run     *slab   // current run: [runOff, runEnd) of run.mem
	runOff  int
	runEnd  int
	inUse   int
	_       [64]byte // keep classes on separate cache lines
}

// Pool hands out registered buffers. It is safe for concurrent use.
type Pool struct {
	reg        Registrar
	slabSize   int
	maxBytes   int64
	largeCache int
	classes    []class

	decay      time.Duration
	decayTimer *time.Timer // runs decayLook; armed while something is idle
	decayArmed atomic.Bool

	closed atomic.Bool

	// slabMu serializes registration, carving runs and the slab list.
	// Lock order: slabMu, then classes[i].mu in index order, then
	// largeMu.
	slabMu sync.Mutex
	slabs  []*slab // size-class slabs not freed

	largeMu    sync.Mutex
	cache      []*Buffer // freed large buffers, at most largeCache
	largeInUse int
	largeBytes int64

	registered atomic.Int64 // bytes
	nslabs     atomic.Int64
	pending    atomic.Int64 // slabs not yet freed (for Drained)
	regs       atomic.Uint64
	deregs     atomic.Uint64

	errMu   sync.Mutex
	freeErr []error // deregistration and unmap failures, for Close

	closeMu   sync.Mutex
	drained   chan struct{}
	drainOnce sync.Once
}

// New makes a pool whose slabs are registered with reg. It maps and
// registers nothing until the first Get.
func New(reg Registrar, opts Options) (*Pool, error) {
	if reg == nil {
		return nil, fmt.Errorf("pool: %w: nil Registrar", verbs.ErrInvalid)
	}
	size := opts.SlabSize
	switch {
	case size == 0:
		size = DefaultSlabSize
	case size < 0 || size > maxSlabSize:
		return nil, fmt.Errorf("pool: %w: SlabSize %d out of range (1 byte to 1 GiB)", verbs.ErrInvalid, size)
	}
	size = max(size, mem.PageSize, minClass)
	size = 1 << bits.Len(uint(size-1)) // power of two
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("pool: %w: negative MaxBytes %d", verbs.ErrInvalid, opts.MaxBytes)
	}
	if opts.MaxBytes > 0 && opts.MaxBytes < int64(size) {
		return nil, fmt.Errorf("pool: %w: MaxBytes %d is less than one slab (%d bytes)", verbs.ErrInvalid, opts.MaxBytes, size)
	}
	lc := opts.LargeCache
	switch {
	case lc == 0:
		lc = DefaultLargeCache
	case lc < 0:
		lc = 0
	}
	p := &Pool{
		reg:        reg,
		slabSize:   size,
		maxBytes:   opts.MaxBytes,
		largeCache: lc,
		cache:      make([]*Buffer, 0, lc),
		drained:    make(chan struct{}),
		decay:      opts.Decay,
	}
	if p.decay > 0 {
		p.decayTimer = time.AfterFunc(time.Hour, p.decayLook)
		p.decayTimer.Stop()
	}
	n := bits.Len(uint(size)) - minClassShift // classes 64 B .. size
	p.classes = make([]class, n)
	for i := range p.classes {
		c := &p.classes[i]
		c.size = minClass << i
		c.runSize = max(c.size, min(maxRunSize, size))
	}
	return p, nil
}

// SlabSize is the size of the pool's slabs and of its largest size class.
func (p *Pool) SlabSize() int { return p.slabSize }

// classOf returns the index of the size class for n (0 < n <= slabSize).
func classOf(n int) int {
	if n <= minClass {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// Get returns a buffer of n bytes holding one reference, the caller's,
// which Release drops. Its memory is zero to its capacity, so no byte of
// an earlier owner is ever visible, even through SetLen: Get clears what
// earlier owners may have written (up to the largest Len they set, or
// what Filled reported), not the whole capacity. Requests up to SlabSize come from the size classes;
// larger ones get a dedicated registered mapping. n must be positive.
func (p *Pool) Get(n int) (*Buffer, error) {
	b, err := p.get(n)
	if err != nil {
		return nil, err
	}
	b.reset(n)
	return b, nil
}

// GetReceive is Get for the target of a receive: it does not clear the
// memory, since the device writes its first bytes, and Filled clears
// what is left of earlier owners' bytes past the count it is given.
// Until Filled the buffer may hold them: the caller must not let anyone
// read it, and a receive that fails is released unread (the next Get
// clears it). A SEND of the size of the last one into a buffer so costs
// no clearing at all, where Get cleared the last message's bytes.
func (p *Pool) GetReceive(n int) (*Buffer, error) {
	if n > p.slabSize {
		return p.Get(n)
	}
	b, err := p.get(n)
	if err != nil {
		return nil, err
	}
	b.n, b.stale = n, true // dirty stays: the earlier owners' extent
	b.state.Store(ownedBit)
	return b, nil
}

// get takes a buffer of at least n bytes, not yet reset for its owner.
func (p *Pool) get(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("pool: Get(%d): %w: length must be positive", n, verbs.ErrInvalid)
	}
	if n > p.slabSize {
		return p.getLarge(n)
	}
	c := &p.classes[classOf(n)]
	c.mu.Lock()
	b, err := p.takeLocked(c)
	c.mu.Unlock()
	if b == nil && err == nil {
		b, err = p.grow(c)
	}
	return b, err
}

// reset readies a buffer taken from the free list or a cache for a new
// owner of n bytes.
func (b *Buffer) reset(n int) {
	clear(b.mem[:b.dirty])
	b.n, b.dirty, b.stale = n, n, false
	b.state.Store(ownedBit)
}

// takeLocked pops a free buffer or cuts one from the current run. It
// returns nil, nil when the class needs a new run.
func (p *Pool) takeLocked(c *class) (*Buffer, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	b := c.free
	if b != nil {
		c.free = b.next
		b.next = nil
	} else if c.run != nil && c.runEnd-c.runOff >= c.size {
		s := c.run
		b = &Buffer{
			mem:   s.mem[c.runOff : c.runOff+c.size : c.runOff+c.size],
			addr:  s.base + uint64(c.runOff),
			lkey:  s.lkey,
			slab:  s,
			class: c,
			pool:  p,
		}
		c.runOff += c.size
	} else {
		return nil, nil
	}
	if b.slab.used.Add(1) == 1 && b.slab.idle.Load() {
		b.slab.idle.Store(false) // in use again: the decay keeps it
	}
	c.inUse++
	return b, nil
}

// grow gives class c a new run, registering a slab if none has room, and
// takes a buffer from it.
func (p *Pool) grow(c *class) (*Buffer, error) {
	p.slabMu.Lock()
	defer p.slabMu.Unlock()
	// Another Get may have refilled the class while we waited.
	c.mu.Lock()
	b, err := p.takeLocked(c)
	c.mu.Unlock()
	if b != nil || err != nil {
		return b, err
	}
	s, off, err := p.carveLocked(c.runSize, c.size)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.closed.Load() {
		// Close runs after us (it needs slabMu) and frees the slab
		// if it is unused.
		return nil, ErrClosed
	}
	c.run, c.runOff, c.runEnd = s, off, off+c.runSize
	return p.takeLocked(c)
}

// carveLocked returns a run of size bytes from a slab with room, or from
// a new slab. need is the size the caller wants, for error messages.
func (p *Pool) carveLocked(size, need int) (*slab, int, error) {
	for _, s := range p.slabs {
		if len(s.mem)-s.next >= size {
			off := s.next
			s.next += size
			return s, off, nil
		}
	}
	s, err := p.newSlabLocked(p.slabSize, need)
	if err != nil {
		return nil, 0, err
	}
	p.slabs = append(p.slabs, s)
	s.next = size
	return s, 0, nil
}

// newSlabLocked maps and registers size bytes, keeping to MaxBytes.
func (p *Pool) newSlabLocked(size, need int) (*slab, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if p.maxBytes > 0 && p.registered.Load()+int64(size) > p.maxBytes {
		// Make room by freeing idle slabs and cached large buffers.
		p.freeAll(p.trimLocked())
		if reg := p.registered.Load(); reg+int64(size) > p.maxBytes {
			return nil, fmt.Errorf("pool: Get(%d) needs a new %d-byte registration but %d of the limit's %d bytes are registered (%d in use): %w",
				need, size, reg, p.maxBytes, p.Stats().BytesInUse, ErrLimit)
		}
	}
	buf, err := mem.Map(size)
	if err != nil {
		return nil, fmt.Errorf("pool: map a %d-byte slab for Get(%d): %w", size, need, err)
	}
	buf = buf[:cap(buf)]
	mr, err := p.reg.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		_ = mem.Unmap(buf)
		hint := ""
		if errors.Is(err, verbs.ErrMemlock) {
			hint = "; raise the locked-memory limit, or lower Options.SlabSize or Options.MaxBytes"
		}
		return nil, fmt.Errorf("pool: registering a %d-byte slab for Get(%d) failed with %d bytes already registered by this pool%s: %w",
			size, need, p.registered.Load(), hint, err)
	}
	s := &slab{mem: buf, mr: mr, base: uint64(uintptr(unsafe.Pointer(&buf[0]))), lkey: mr.LKey()}
	p.registered.Add(int64(size))
	p.nslabs.Add(1)
	p.pending.Add(1)
	p.regs.Add(1)
	return s, nil
}

// freeSlab deregisters and unmaps s. The caller has set s.freed. If
// deregistration fails the memory stays mapped (the device may still use
// it) and the error is kept for Close.
func (p *Pool) freeSlab(s *slab) {
	if err := s.mr.Close(); err != nil {
		p.keepErr(fmt.Errorf("pool: deregister a %d-byte slab (left mapped): %w", len(s.mem), err))
	} else {
		p.deregs.Add(1)
		p.registered.Add(-int64(len(s.mem)))
		p.nslabs.Add(-1)
		if err := mem.Unmap(s.mem); err != nil {
			p.keepErr(fmt.Errorf("pool: unmap a %d-byte slab: %w", len(s.mem), err))
		}
	}
	if p.pending.Add(-1) == 0 && p.closed.Load() {
		p.drainOnce.Do(func() { close(p.drained) })
	}
}

func (p *Pool) freeAll(ss []*slab) {
	for _, s := range ss {
		p.freeSlab(s)
	}
}

func (p *Pool) keepErr(err error) {
	p.errMu.Lock()
	p.freeErr = append(p.freeErr, err)
	p.errMu.Unlock()
}

// getLarge returns a dedicated buffer for n > slabSize bytes.
func (p *Pool) getLarge(n int) (*Buffer, error) {
	if n > maxLarge {
		return nil, fmt.Errorf("pool: Get(%d): %w: length too large", n, verbs.ErrInvalid)
	}
	size := (n + mem.PageSize - 1) &^ (mem.PageSize - 1)
	p.largeMu.Lock()
	if p.closed.Load() {
		p.largeMu.Unlock()
		return nil, ErrClosed
	}
	b := p.takeCachedLocked(size)
	if b != nil {
		p.largeInUse++
		p.largeBytes += int64(len(b.mem))
	}
	p.largeMu.Unlock()
	if b == nil {
		p.slabMu.Lock()
		s, err := p.newSlabLocked(size, n)
		if err != nil {
			p.slabMu.Unlock()
			return nil, err
		}
		b = &Buffer{mem: s.mem, addr: s.base, lkey: s.lkey, slab: s, pool: p}
		s.used.Store(1)
		p.largeMu.Lock()
		p.largeInUse++
		p.largeBytes += int64(size)
		p.largeMu.Unlock()
		p.slabMu.Unlock()
	}
	return b, nil
}

// maxLarge keeps page rounding from overflowing.
const maxLarge = 1<<62 - 1

// takeCachedLocked removes and returns the smallest cached buffer of at
// least size bytes and at most twice that, or nil.
func (p *Pool) takeCachedLocked(size int) *Buffer {
	best := -1
	for i, b := range p.cache {
		if c := len(b.mem); c >= size && c/2 <= size && (best < 0 || c < len(p.cache[best].mem)) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := p.cache[best]
	last := len(p.cache) - 1
	p.cache[best] = p.cache[last]
	p.cache[last] = nil
	p.cache = p.cache[:last]
	return b
}

// put takes back a buffer whose last reference was dropped.
func (p *Pool) put(b *Buffer) {
	c := b.class
	if c == nil {
		p.putLarge(b)
		return
	}
	if b.stale {
		// A receive that failed, or was taken back, unread: the device
		// may have written any of its n bytes.
		b.dirty, b.stale = max(b.dirty, b.n), false
	}
	s := b.slab
	c.mu.Lock()
	c.inUse--
	if !p.closed.Load() {
		b.next = c.free
		c.free = b
		idle := s.used.Add(-1) == 0
		c.mu.Unlock()
		if idle {
			p.armDecay()
		}
		return
	}
	// Closed: Close freed the slabs that were idle when it ran, while
	// holding every class lock; the others are freed by the buffer that
	// drops their last reference.
	last := s.used.Add(-1) == 0
	c.mu.Unlock()
	if last && s.freed.CompareAndSwap(false, true) {
		p.freeSlab(s)
	}
}

func (p *Pool) putLarge(b *Buffer) {
	p.largeMu.Lock()
	p.largeInUse--
	p.largeBytes -= int64(len(b.mem))
	if !p.closed.Load() && len(p.cache) < p.largeCache {
		b.slab.idle.Store(false)
		p.cache = append(p.cache, b)
		p.largeMu.Unlock()
		p.armDecay()
		return
	}
	p.largeMu.Unlock()
	b.slab.used.Store(0)
	if b.slab.freed.CompareAndSwap(false, true) {
		p.freeSlab(b.slab)
	}
}

// lockAll takes every class lock and largeMu; the caller holds slabMu.
func (p *Pool) lockAll() {
	for i := range p.classes {
		p.classes[i].mu.Lock()
	}
	p.largeMu.Lock()
}

func (p *Pool) unlockAll() {
	p.largeMu.Unlock()
	for i := len(p.classes) - 1; i >= 0; i-- {
		p.classes[i].mu.Unlock()
	}
}

// trimLocked detaches every size-class slab without a buffer in use and
// every cached large buffer, and returns them for freeSlab. The caller
// holds slabMu.
func (p *Pool) trimLocked() []*slab {
	out, _ := p.detachLocked(false)
	return out
}

// armDecay starts the decay timer, if it is not running: something has
// become idle.
func (p *Pool) armDecay() {
	if p.decay > 0 && !p.decayArmed.Load() && p.decayArmed.CompareAndSwap(false, true) {
		p.decayTimer.Reset(p.decay)
	}
}

// decayLook frees what stayed idle since the last look and marks what is
// idle now; it runs on the decay timer, which it rearms while something
// idle is left.
func (p *Pool) decayLook() {
	p.slabMu.Lock()
	out, left := p.detachLocked(true)
	p.freeAll(out)
	p.slabMu.Unlock()
	if left {
		p.decayTimer.Reset(p.decay)
	}
}

// detachLocked detaches slabs and cached large buffers for freeSlab:
// without decay every idle one; with decay those marked idle at the
// last look and not used since (keeping one slab while buffers are in
// use), marking the idle ones left. It reports whether any idle one is
// left, and records that as decayArmed while no put can run. The caller
// holds slabMu.
func (p *Pool) detachLocked(decay bool) (out []*slab, left bool) {
	p.lockAll()
	defer func() {
		if decay {
			p.decayArmed.Store(left)
		}
		p.unlockAll()
	}()
	if p.closed.Load() {
		return nil, false
	}
	headroom := 0
	if decay {
		inUse := p.largeInUse
		for i := range p.classes {
			inUse += p.classes[i].inUse
		}
		if inUse > 0 {
			headroom = 1
		}
	}
	keep := p.slabs[:0]
	for _, s := range p.slabs {
		// With every class lock held no Get or put is running, so
		// used is stable.
		switch {
		case s.used.Load() != 0:
			keep = append(keep, s)
		case decay && (!s.idle.Load() || headroom > 0):
			if s.idle.Load() {
				headroom--
			}
			s.idle.Store(true)
			keep = append(keep, s)
			left = true
		default:
			s.freed.Store(true)
			out = append(out, s)
		}
	}
	clear(p.slabs[len(keep):])
	p.slabs = keep
	if len(out) > 0 {
		for i := range p.classes {
			c := &p.classes[i]
			var head *Buffer
			tail := &head
			for b := c.free; b != nil; {
				next := b.next
				if !b.slab.freed.Load() {
					*tail = b
					tail = &b.next
				}
				b.next = nil
				b = next
			}
			c.free = head
			if c.run != nil && c.run.freed.Load() {
				c.run, c.runOff, c.runEnd = nil, 0, 0
			}
		}
	}
	cached := p.cache[:0]
	for _, b := range p.cache {
		if decay && !b.slab.idle.Load() {
			b.slab.idle.Store(true)
			cached = append(cached, b)
			left = true
			continue
		}
		b.slab.freed.Store(true)
		out = append(out, b.slab)
	}
	clear(p.cache[len(cached):])
	p.cache = cached
	return out, left
}

// Trim deregisters and unmaps every size-class slab that holds no buffer
// in use, and every cached large buffer. Get does this by itself before
// it would pass Options.MaxBytes. The error reports failed
// deregistrations.
func (p *Pool) Trim() error {
	p.slabMu.Lock()
	ss := p.trimLocked()
	p.freeAll(ss)
	p.slabMu.Unlock()
	return p.takeErrs()
}

func (p *Pool) takeErrs() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	err := errors.Join(p.freeErr...)
	p.freeErr = nil
	return err
}

// Stats returns a snapshot of the pool's accounting.
func (p *Pool) Stats() Stats {
	st := Stats{
		Slabs:           int(p.nslabs.Load()),
		BytesRegistered: p.registered.Load(),
		Registrations:   p.regs.Load(),
		Deregistrations: p.deregs.Load(),
	}
	for i := range p.classes {
		c := &p.classes[i]
		c.mu.Lock()
		st.BuffersInUse += c.inUse
		st.BytesInUse += int64(c.inUse) * int64(c.size)
		c.mu.Unlock()
	}
	p.largeMu.Lock()
	st.BuffersInUse += p.largeInUse
	st.BytesInUse += p.largeBytes
	p.largeMu.Unlock()
	return st
}

// Close stops new Gets (they fail with ErrClosed) and deregisters and
// unmaps every slab without a buffer in use, and the cached large
// buffers.
//
// Memory under a buffer that still holds a reference (its owner's or an
// operation's) is never freed by Close: Close then returns an error
// wrapping verbs.ErrBusy that counts those buffers, and each remaining
// slab is freed when its last buffer is released. Drained is closed when
// everything is freed. Calling Close again is safe: it returns nil once
// nothing is in use, or the same kind of ErrBusy error. Failed
// deregistrations are reported too; that memory stays mapped.
func (p *Pool) Close() error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.decayTimer != nil {
		p.decayTimer.Stop() // a look that runs anyway finds the pool closed
	}
	// Wait for registrations in progress, then stop everything: every
	// Get and put checks closed under a lock held here.
	p.slabMu.Lock()
	p.lockAll()
	p.closed.Store(true)
	var free []*slab
	for _, s := range p.slabs {
		if s.used.Load() == 0 && s.freed.CompareAndSwap(false, true) {
			free = append(free, s)
		}
	}
	p.slabs = nil
	inUse, bytesInUse := p.largeInUse, p.largeBytes
	for i := range p.classes {
		c := &p.classes[i]
		c.free = nil
		c.run, c.runOff, c.runEnd = nil, 0, 0
		inUse += c.inUse
		bytesInUse += int64(c.inUse) * int64(c.size)
	}
	for i, b := range p.cache {
		if b.slab.freed.CompareAndSwap(false, true) {
			free = append(free, b.slab)
		}
		p.cache[i] = nil
	}
	p.cache = p.cache[:0]
	p.unlockAll()
	p.slabMu.Unlock()

	p.freeAll(free)
	if p.pending.Load() == 0 {
		p.drainOnce.Do(func() { close(p.drained) })
	}
	err := p.takeErrs()
	if inUse > 0 {
		err = errors.Join(fmt.Errorf("pool: close: %w: %d buffers (%d bytes) still referenced; their slabs are freed when the last reference is dropped",
			verbs.ErrBusy, inUse, bytesInUse), err)
	}
	return err
}

// Drained returns a channel that is closed once the pool is closed and
// every slab has been deregistered and unmapped (or failed to be; Close
// reports that). After it is closed the registrar may be closed.
func (p *Pool) Drained() <-chan struct{} { return p.drained }
