#!/usr/bin/env bash
# Runs go-rdma's main example. It uses a real RDMA device where one is
# usable and the pure-Go soft provider otherwise. Building needs only Go:
# with a C compiler it builds the cgo binding (real devices, loaded at run
# time), without one the pure-Go variant (soft provider only).
set -euo pipefail
cd "$(dirname "$0")"
if [ "${CGO_ENABLED:-}" != 0 ] && ! command -v "$(go env CC)" >/dev/null 2>&1; then
  echo "example: no C compiler; building without cgo (soft provider only)" >&2
  export CGO_ENABLED=0
fi
exec go run ./cmd/examples/quickstart "$@"
