// Package verbs is the provider-neutral RDMA verbs interface that the
// upper layers of go-rdma program against.
//
// Two providers implement it: internal/ibv (libibverbs through cgo: mlx5,
// Soft-RoCE rxe, ...) and internal/soft (pure Go, the default where no RDMA
// device exists). The interface speaks about semantics, not libibverbs
// structs: queue pair transitions take only what each transition needs, and
// work requests and completions are plain Go values.
//
// The rules every provider keeps, and the conformance suite checks:
//   - A successful post is not a completion. Memory named by a non-inline
//     SGE stays in use until a signaled completion covers its WR.
//   - PostSend and PostRecv take whole chains. On failure they report how
//     many WRs were accepted; those WRs were posted and will complete.
//   - In a failed WorkCompletion only WRID, Status, QPN and VendorErr are
//     valid.
//   - Objects are closed children first. Closing a parent that still has
//     live children fails with ErrBusy and destroys nothing.
//   - Close is safe to call twice; any other use of a closed object fails
//     with an error that wraps ErrClosed.
//   - Registered memory lives off the Go heap (see internal/mem).
package verbs
