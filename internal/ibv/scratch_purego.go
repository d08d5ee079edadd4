//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"fmt"
	"syscall"
)

// mapScratch maps n bytes of zeroed memory off the Go heap for what C
// reads or writes during a call: the WR chains and SGE arrays a post
// builds, the struct ibv_wc array a poll fills, the out-parameters of
// ibv_get_cq_event. The GC never moves or scans it, and C may keep
// pointers into it for the call (bad_wr) without holding a Go pointer.
// It is not internal/mem's: that accounts for registered memory.
func mapScratch(n int) ([]byte, error) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("ibv: map %d bytes of scratch: %w", n, err)
	}
	return b, nil
}

func unmapScratch(b []byte) {
	if b != nil {
		syscall.Munmap(b)
	}
}
