#!/usr/bin/env bash
# Runs go-rdma's main example. It uses a real RDMA device where one is
# usable and the pure-Go soft provider otherwise. Building needs only Go:
# with a C compiler it builds the cgo binding, without one (CGO_ENABLED=0)
# the purego binding, which on linux/amd64 and linux/arm64 drives the
# same devices (elsewhere a build without cgo has the soft provider only).
# Neither needs rdma-core's headers; libibverbs is loaded at run time.
set -euo pipefail
cd "$(dirname "$0")"
if [ "${CGO_ENABLED:-}" != 0 ] && ! command -v "$(go env CC)" >/dev/null 2>&1; then
  echo "example: no C compiler; building with CGO_ENABLED=0 (the purego binding)" >&2
  export CGO_ENABLED=0
fi
exec go run ./cmd/examples/quickstart "$@"
