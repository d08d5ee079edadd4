// Package rdma gives Go programs RDMA (remote direct memory access) over
// InfiniBand and RoCE with an asynchronous API.
//
// Two providers implement the verbs underneath: "verbs" drives real
// devices through libibverbs (mlx5, Soft-RoCE rxe, ...), and "soft" is a
// pure-Go implementation with the same semantics, the default where no
// RDMA device exists. Devices lists what this machine has.
package rdma
