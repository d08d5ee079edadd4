// Package abicheck compares internal/ibv/abi.h, the part of the
// libibverbs and librdmacm ABI that package ibv declares itself, with
// rdma-core's headers. It is built only with the rdmaheaders tag, where
// those headers are installed (libibverbs-dev, librdmacm-dev):
//
//	go test -tags rdmaheaders ./internal/ibv/abicheck
package abicheck
