// Package mem maps memory off the Go heap for registration.
//
// The NIC (or the soft provider's transport goroutines) reads and writes
// registered memory after the call that posted a work request returns, so
// that memory must never be something the Go garbage collector can move or
// free: it comes from mmap, and it is tracked here so a provider can refuse
// anything else.
package mem

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"unsafe"
)

// ErrNotMapped: the slice is not inside memory mapped by this package.
var ErrNotMapped = errors.New("memory not mapped by internal/mem (registered memory must live off the Go heap)")

var (
	mu      sync.Mutex
	regions = map[uintptr]int{} // base -> length
)

// PageSize is the system page size.
var PageSize = syscall.Getpagesize()

// Map returns n bytes (rounded up to whole pages) of zeroed anonymous
// memory mapped off the Go heap.
func Map(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("mem: map %d bytes: length must be positive", n)
	}
	size := (n + PageSize - 1) &^ (PageSize - 1)
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mem: mmap %d bytes: %w", size, err)
	}
	mu.Lock()
	regions[uintptr(unsafe.Pointer(&b[0]))] = size
	mu.Unlock()
	return b[:n:size], nil
}

// Unmap releases memory returned by Map. b must be the slice Map returned
// (its capacity is used).
func Unmap(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	mu.Lock()
	size, ok := regions[base]
	if ok {
		delete(regions, base)
	}
	mu.Unlock()
	if !ok {
		return ErrNotMapped
	}
	return syscall.Munmap(unsafe.Slice(unsafe.SliceData(b), size))
}

// Check returns nil if b lies wholly inside one mapping made by Map.
func Check(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	start := uintptr(unsafe.Pointer(&b[0]))
	end := start + uintptr(len(b))
	mu.Lock()
	defer mu.Unlock()
	for base, size := range regions {
		if start >= base && end <= base+uintptr(size) {
			return nil
		}
	}
	return ErrNotMapped
}

// Mapped is the number of live mappings, for leak checks in tests.
func Mapped() int {
	mu.Lock()
	defer mu.Unlock()
	return len(regions)
}
