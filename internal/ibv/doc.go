// Package ibv is the verbs provider backed by libibverbs: mlx5, Soft-RoCE
// (rxe), siw and every other device rdma-core drives. It is the only
// package of go-rdma that imports "C", and the only one that calls C.
//
// Rules at the boundary with C:
//   - No C type appears in an exported signature: the package implements
//     the interfaces of internal/verbs.
//   - C never keeps a Go pointer. Work requests are flattened into arrays
//     without pointers; the C shim builds the ibv_send_wr chain in C
//     memory owned by the QP and posts it in one call. Registered memory
//     comes from internal/mem (mmap), never from the Go heap.
//   - wr_id is the caller's integer, passed through untouched.
//   - One cgo call polls up to 128 completions.
//   - Completion and async-event fds are non-blocking and waited on
//     through Go's netpoller, so no OS thread blocks in C.
//   - libibverbs and librdmacm are not linked: loader.c opens them with
//     dlopen at their first use and resolves each function once, so one
//     binary runs with and without rdma-core installed. Building needs
//     no rdma-core headers: abi.h declares the part of their ABI the
//     package uses, and internal/ibv/abicheck compares it with the real
//     headers. The hot path's verbs are inline functions (verbs.h's,
//     redefined in abi.h) that call through the device's ops table and
//     need no symbol. Without libibverbs, Provider lists the devices of sysfs as
//     unusable and Open fails with verbs.ErrNotSupported; without
//     librdmacm, CMListen and CMDial fail the same way. $GO_RDMA_LIBIBVERBS
//     and $GO_RDMA_LIBRDMACM name other files to load (libraries.go).
//
// Without cgo, on linux/amd64 and linux/arm64, the purego binding
// (loader_purego.go and the other *_purego.go files) does the same
// through github.com/ebitengine/purego: the same functions resolved at
// the same symbol versions, the hot-path ops called through the ops
// table at the offsets of abi.go (abi.h's mirror, checked against it by
// abi_cgo.go in every cgo build), WR chains, SGEs and the ibv_wc array in
// memory mapped off the Go heap; its rdma_cm (cm_purego.go) loads
// librdmacm the same way. Each binding is only the calls into C, on
// handles to the C objects (ctxHandle, cqHandle, qpHandle, cmHandles,
// ...) taking and returning Go values; the logic above them (checks,
// lifetimes, state, error texts) is written once for both, in the
// *_shared.go files. TestBindingDuplicates keeps it so. Elsewhere
// without cgo, or off Linux, Provider lists devices from sysfs but every
// other call fails with verbs.ErrNotSupported.
package ibv
