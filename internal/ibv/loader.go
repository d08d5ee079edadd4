//go:build linux && cgo

package ibv

/*
// dlopen is in libc from glibc 2.34 on; -ldl keeps older ones building.
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "loader.h"
*/
import "C"

import "unsafe"

// The libraries are loaded at their first use rather than linked, so
// that one binary runs with and without rdma-core installed (loader.h);
// loader_shared.go holds the once of each load.

func loadVerbsFrom(path string) error {
	return load("libibverbs", path, EnvLibibverbs, func(p, msg *C.char, n C.size_t) C.int { return C.gordma_load_ibv(p, msg, n) })
}

func loadCMFrom(path string) error {
	return load("librdmacm", path, EnvLibrdmacm, func(p, msg *C.char, n C.size_t) C.int { return C.gordma_load_rdmacm(p, msg, n) })
}

// load runs one of loader.c's loaders on path and explains a failure.
func load(lib, path, env string, open func(path, msg *C.char, n C.size_t) C.int) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	if open(cpath, &msg[0], C.size_t(len(msg))) != 0 {
		return loadFailed(lib, path, env, C.GoString(&msg[0]))
	}
	return nil
}
