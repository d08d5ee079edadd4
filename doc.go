// Package rdma gives Go programs RDMA (remote direct memory access) over
// InfiniBand and RoCE with an asynchronous API.
//
// Two providers implement the verbs underneath: "verbs" drives real
// devices through libibverbs (mlx5, Soft-RoCE rxe, ...), and "soft" is a
// pure-Go implementation with the same semantics, the default where no
// RDMA device exists. Devices lists what this machine has.
//
// A binary does not link rdma-core: libibverbs and librdmacm are loaded
// at run time, so a binary built anywhere runs where they are installed
// and where they are not (there on the soft provider). Building needs no
// rdma-core headers: with cgo, internal/ibv declares the part of the ABI
// it uses itself; with CGO_ENABLED=0 on linux/amd64 and linux/arm64, a
// binding through github.com/ebitengine/purego drives the same devices,
// rdma_cm included. A CGO_ENABLED=0 build for another architecture, or a
// build for another OS, has the soft provider only.
//
// Where the libraries are missing, every verbs device is listed as
// unusable with the reason, the provider "verbs" fails with an error
// matching ErrNoDevice and ErrNotSupported, and WithRDMACM with one
// matching ErrNotSupported. $GO_RDMA_LIBIBVERBS and $GO_RDMA_LIBRDMACM
// name the files to load instead of libibverbs.so.1 and librdmacm.so.1,
// for an rdma-core outside the dynamic loader's search path.
package rdma
