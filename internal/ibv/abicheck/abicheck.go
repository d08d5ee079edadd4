//go:build rdmaheaders && linux && cgo

package abicheck

/*
#include "entries.h"
extern const abicheck_entry abicheck_real[];
extern const int abicheck_real_n;
extern const abicheck_entry abicheck_ours[];
extern const int abicheck_ours_n;
*/
import "C"

import "unsafe"

// Entry is one size, offset or constant, by name.
type Entry struct {
	Name  string
	Value uint64
}

// Real is list.h evaluated against rdma-core's headers, Ours against
// abi.h, in the same order.
func Real() []Entry { return entries(unsafe.Pointer(&C.abicheck_real), C.abicheck_real_n) }

// Ours is list.h evaluated against abi.h.
func Ours() []Entry { return entries(unsafe.Pointer(&C.abicheck_ours), C.abicheck_ours_n) }

func entries(p unsafe.Pointer, n C.int) []Entry {
	out := make([]Entry, 0, int(n))
	for _, e := range unsafe.Slice((*C.abicheck_entry)(p), int(n)) {
		out = append(out, Entry{C.GoString(e.name), uint64(e.value)})
	}
	return out
}
