//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The purego binding: a CGO_ENABLED=0 build calls libibverbs through
// github.com/ebitengine/purego, which calls C function pointers from Go
// on linux/amd64 and linux/arm64. The library is loaded at its first use
// (dlopen, as loader.c does for the cgo build), each function resolved
// once at the symbol version a link would bind, and the hot-path verbs
// are called through the context's ops table at the offsets abi.go
// declares. librdmacm is loaded the same way at the first use of
// rdma_cm (cm_purego.go).

// ibvFns holds the resolved libibverbs functions, as loader.c's struct
// ibv_fns does.
type ibvFns struct {
	getDeviceList, freeDeviceList, getDeviceName, openDevice, closeDevice uintptr
	queryDevice, queryPort, queryGID, getAsyncEvent, ackAsyncEvent        uintptr
	allocPD, deallocPD, regMR, deregMR                                    uintptr
	createCompChannel, destroyCompChannel                                 uintptr
	createCQ, destroyCQ, getCQEvent, ackCQEvents                          uintptr
	createSRQ, modifySRQ, destroySRQ                                      uintptr
	createQP, queryQP, modifyQP, destroyQP, createAH, destroyAH           uintptr
	attachMcast, detachMcast                                              uintptr
}

var (
	ibv ibvFns
	// errnoLocation is libc's __errno_location: errno of the calling
	// thread, read right after a call on the same locked thread.
	errnoLocation uintptr
)

func loadVerbsFrom(path string) error {
	if err := loadIBV(path); err != nil {
		return loadFailed("libibverbs", path, EnvLibibverbs, err.Error())
	}
	return nil
}

func loadCMFrom(path string) error {
	if err := loadRDMACM(path); err != nil {
		return loadFailed("librdmacm", path, EnvLibrdmacm, err.Error())
	}
	return nil
}

// sym names a function, the symbol version to bind and where to store
// it: the version a link against rdma-core's libraries binds.
type sym struct {
	name, version string
	slot          *uintptr
}

// libc is libc's dlvsym and __errno_location, resolved once.
var libc = sync.OnceValues(func() ([2]uintptr, error) {
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return [2]uintptr{}, err
	}
	dlvsym, err := purego.Dlsym(h, "dlvsym")
	if err != nil {
		return [2]uintptr{}, err
	}
	errloc, err := purego.Dlsym(h, "__errno_location")
	if err != nil {
		return [2]uintptr{}, err
	}
	return [2]uintptr{dlvsym, errloc}, nil
})

// dlopenSyms dlopens path and resolves syms. The library is never
// closed after a successful load: the objects it makes point into it.
func dlopenSyms(path string, syms []sym) error {
	fns, err := libc()
	if err != nil {
		return err
	}
	dlvsym := fns[0]
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return err
	}
	for _, s := range syms {
		name, version := cString(s.name), cString(s.version)
		p := ccall(dlvsym, h, uintptr(unsafe.Pointer(&name[0])), uintptr(unsafe.Pointer(&version[0])))
		if p == 0 {
			purego.Dlclose(h)
			return fmt.Errorf("%s has no %s@%s: rdma-core too old?", path, s.name, s.version)
		}
		*s.slot = p
	}
	return nil
}

// loadIBV dlopens libibverbs from path and resolves every function into
// ibv.
func loadIBV(path string) error {
	fns, err := libc()
	if err != nil {
		return err
	}
	const v10, v11 = "IBVERBS_1.0", "IBVERBS_1.1"
	var next ibvFns
	syms := []sym{
		{"ibv_get_device_list", v11, &next.getDeviceList},
		{"ibv_free_device_list", v11, &next.freeDeviceList},
		{"ibv_get_device_name", v11, &next.getDeviceName},
		{"ibv_open_device", v11, &next.openDevice},
		{"ibv_close_device", v11, &next.closeDevice},
		{"ibv_query_device", v11, &next.queryDevice},
		{"ibv_query_port", v11, &next.queryPort},
		{"ibv_query_gid", v11, &next.queryGID},
		{"ibv_get_async_event", v11, &next.getAsyncEvent},
		{"ibv_ack_async_event", v11, &next.ackAsyncEvent},
		{"ibv_alloc_pd", v11, &next.allocPD},
		{"ibv_dealloc_pd", v11, &next.deallocPD},
		{"ibv_reg_mr", v11, &next.regMR}, // ibv_reg_mr_iova2 with the address as iova
		{"ibv_dereg_mr", v11, &next.deregMR},
		{"ibv_create_comp_channel", v10, &next.createCompChannel}, // never changed: 1.0 only
		{"ibv_destroy_comp_channel", v10, &next.destroyCompChannel},
		{"ibv_create_cq", v11, &next.createCQ},
		{"ibv_destroy_cq", v11, &next.destroyCQ},
		{"ibv_get_cq_event", v11, &next.getCQEvent},
		{"ibv_ack_cq_events", v11, &next.ackCQEvents},
		{"ibv_create_srq", v11, &next.createSRQ},
		{"ibv_modify_srq", v11, &next.modifySRQ},
		{"ibv_destroy_srq", v11, &next.destroySRQ},
		{"ibv_create_qp", v11, &next.createQP},
		{"ibv_query_qp", v11, &next.queryQP},
		{"ibv_modify_qp", v11, &next.modifyQP},
		{"ibv_destroy_qp", v11, &next.destroyQP},
		{"ibv_create_ah", v11, &next.createAH},
		{"ibv_destroy_ah", v11, &next.destroyAH},
		{"ibv_attach_mcast", v11, &next.attachMcast},
		{"ibv_detach_mcast", v11, &next.detachMcast},
	}
	if err := dlopenSyms(path, syms); err != nil {
		return err
	}
	ibv, errnoLocation = next, fns[1]
	return nil
}

// ccall calls the C function fn. Go memory that an argument points to
// stays where it is and alive for the call (uintptrescapes); C keeps
// none of it.
//
//go:uintptrescapes
func ccall(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// ccallErrno is ccall for a function that reports failure in errno: it
// clears errno, calls fn and reads errno on the same OS thread.
//
//go:uintptrescapes
func ccallErrno(fn uintptr, args ...uintptr) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	errp := at[int32](ccall(errnoLocation), 0)
	*errp = 0
	r, _, _ := purego.SyscallN(fn, args...)
	if e := *errp; e != 0 {
		return r, syscall.Errno(e)
	}
	return r, nil
}

// ccallStatus calls the C function fn, which returns 0, or -1 with errno
// set: nil, or the errno (EIO when it left none).
//
//go:uintptrescapes
func ccallStatus(fn uintptr, args ...uintptr) error {
	if rc, err := ccallErrno(fn, args...); int32(rc) != 0 {
		return callErr(err)
	}
	return nil
}

// cString is s with a NUL, for the duration of one call.
func cString(s string) []byte { return append([]byte(s), 0) }

// goString copies the NUL-terminated C string at p.
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	n := 0
	for *at[byte](p, n) != 0 {
		n++
	}
	return string(unsafe.Slice(at[byte](p, 0), n))
}
