// Package pool is the registered buffer pool of go-rdma: memory that a
// NIC may read and write, handed out in buffers of any size and recycled
// without registering memory again.
//
// # Design
//
// Registering memory pins its pages and maps them for DMA. It costs tens
// of microseconds per call and counts against RLIMIT_MEMLOCK, so a pool
// registers memory rarely and in large pieces:
//
//   - Slabs. Memory comes from explicit slabs of Options.SlabSize bytes
//     (4 MiB by default), mapped with mmap through internal/mem, off the Go
//     heap, and registered once each with the pool's [Registrar] (a PD) for
//     local write only. No Go-heap memory is ever registered, because the
//     device writes to registered memory after the registering call has
//     returned.
//   - Laziness. New maps and registers nothing. The first Get that needs
//     memory maps and registers one slab. Later Gets carve that slab until
//     it is used up, and only then is another one registered.
//   - Size classes. Requests are rounded up to a power of two from 64 bytes
//     to the slab size. Every class carves runs of at least 64 KiB (or the
//     slab size if smaller) out of the shared slabs, and cuts them into
//     buffers as they are first needed. All classes share the same slabs,
//     so a program that uses ten sizes still registers one 4 MiB slab, not
//     ten. A freed buffer goes onto its class's free list and the next Get
//     of that class reuses it: no registration, no system call, and no
//     allocation.
//   - Large buffers. A request larger than the slab size gets a dedicated
//     mapping of its own, rounded up to whole pages and registered on
//     demand. When it is freed it is deregistered and unmapped, unless the
//     small cache of freed large buffers (Options.LargeCache, 2 by
//     default) has room. The cache is used only for requests of at least
//     half a cached buffer's size.
//   - Alignment. Every buffer starts on a multiple of 64 bytes, and
//     buffers of 4 KiB and more start on a page, so 8-byte atomic targets
//     are always aligned.
//   - Contents. A fresh slab is zero. A reused buffer still holds what its
//     last user left there: clear it if that matters.
//
// Memory of the size-class slabs stays registered while the pool is open.
// [Pool.Trim] deregisters and unmaps the slabs that hold no buffer in use,
// and Get does that by itself when Options.MaxBytes would otherwise be
// exceeded.
//
// # Why not allocator hooks
//
// async-rdma registered memory from jemalloc extent hooks, so that any
// allocation could be used for RDMA. Those hooks caused its worst bugs: a
// lookup failed after a large buffer was freed, memory came from the wrong
// arena when several threads allocated, and "dalloc failed" panics
// followed. The lifetime of registered memory is then decided by an
// allocator that knows nothing about registrations, protection domains or
// operations still in flight. Here the slabs are explicit: this package
// maps them, registers them, knows which buffers of each slab are in use,
// and frees a slab only when none is.
//
// # References
//
// A buffer goes back to the pool when its last reference is dropped:
//
//   - Get returns a buffer holding one reference, the owner's, which
//     [Buffer.Release] drops.
//   - Every operation that uses the buffer takes one more with
//     [Buffer.Ref] before it is posted, and drops it with [Buffer.Unref]
//     when a signaled completion covers it (or the post fails).
//
// Releasing a buffer while an operation still uses it is therefore safe:
// the memory is not reused until the completion arrives. After Release,
// Ref fails with [ErrReleased], so a released buffer cannot be posted
// again, and Bytes returns nil. Releasing twice returns ErrReleased and
// changes nothing.
//
// Buffer structs are recycled with their memory, so that Get allocates
// nothing. A *Buffer must therefore not be used after Release: once the
// pool has handed the same *Buffer to the next Get, a stale pointer names
// the new owner's buffer. ErrReleased catches the mistakes made before
// that. Code that passes buffers to callers it does not trust should wrap
// each one in a handle of its own that it never recycles.
//
// # Errors
//
// Registration failures are returned wrapped, with the slab size and what
// the pool had registered already; a provider's RLIMIT_MEMLOCK error
// (verbs.ErrMemlock, which names `ulimit -l`) stays matchable with
// errors.Is. Passing Options.MaxBytes gives an error wrapping [ErrLimit]
// at once; Get never waits for memory.
//
// # Closing
//
// [Pool.Close] stops new Gets and deregisters and unmaps every slab that
// has no buffer in use. It never frees memory under a buffer that still
// holds a reference, because an operation in flight may be using it. Such
// buffers make Close return an error wrapping verbs.ErrBusy that says how
// many there are, and their slabs are freed when the last reference is
// dropped. [Pool.Drained] is closed when everything is freed, which is
// the moment the registrar (the PD) may be closed. Close may be called
// again; it reports what is still in use.
//
// All methods of Pool and Buffer are safe for concurrent use, except
// that [Buffer.SetLen] must not race with other uses of the same buffer.
package pool
