#!/usr/bin/env bash
# Runs go-rdma's main example. It uses a real RDMA device where one is
# usable and the pure-Go soft provider otherwise. As root on a fresh Debian
# machine it first installs the libibverbs headers the cgo provider builds
# against; without them (and not root) it builds the pure-Go variant.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/deps.sh
if ! ensure_host_deps >/dev/null 2>&1; then
  echo "example: libibverbs headers missing; building without cgo (soft provider only)" >&2
  export CGO_ENABLED=0
fi
exec go run ./cmd/examples/quickstart "$@"
