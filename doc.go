// Package rdma gives Go programs RDMA (remote direct memory access) over
// InfiniBand and RoCE with an asynchronous API.
//
// Two providers implement the verbs underneath: "verbs" drives real
// devices through libibverbs (mlx5, Soft-RoCE rxe, ...), and "soft" is a
// pure-Go implementation with the same semantics, the default where no
// RDMA device exists. Devices lists what this machine has.
//
// A binary does not link rdma-core: libibverbs and librdmacm are loaded
// at run time, so a binary built where they are installed (their headers
// are needed to build with cgo) also runs where they are not, on the
// soft provider. There every verbs device is listed as unusable with the
// reason, the provider "verbs" fails with an error matching ErrNoDevice
// and ErrNotSupported, and WithRDMACM with one matching ErrNotSupported.
// $GO_RDMA_LIBIBVERBS and $GO_RDMA_LIBRDMACM name the files to load
// instead of libibverbs.so.1 and librdmacm.so.1, for an rdma-core outside
// the dynamic loader's search path.
package rdma
