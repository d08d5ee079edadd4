#!/usr/bin/env bash
# Proves that a program importing go-rdma builds without rdma-core's
# headers, as on a stock Go machine (gcc, cgo on, no libibverbs-dev): in a
# private mount namespace that hides /usr/include/infiniband and
# /usr/include/rdma, it builds a fresh module with one main.go that calls
# rdma.Devices(), with an empty build cache (a warm one hid the failure
# once), with CGO_ENABLED=1 and then 0, and runs each binary.
# Needs root (unshare -m); as another user it reruns itself with sudo -n.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" != --inside ]; then
  if [ "$(id -u)" != 0 ]; then exec sudo -n -E "$0" "$@"; fi
  exec unshare -m --propagation private "$0" --inside
fi

empty=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$empty" "$work"' EXIT
for d in /usr/include/infiniband /usr/include/rdma; do
  [ -d "$d" ] && mount --bind "$empty" "$d"
done
if [ -e /usr/include/infiniband/verbs.h ]; then echo "verbs.h still visible" >&2; exit 1; fi

mkdir "$work/app"
cd "$work/app"
cat > go.mod <<MOD
module noheaders

go $(cd "$repo" && go list -m -f '{{.GoVersion}}')

require github.com/go-rdma/rdma v0.0.0

replace github.com/go-rdma/rdma => $repo
MOD
cat > main.go <<'GO'
package main

import (
	"fmt"
	"os"

	"github.com/go-rdma/rdma"
)

func main() {
	devs, err := rdma.Devices()
	if err != nil {
		fmt.Println("rdma.Devices:", err)
		os.Exit(1)
	}
	verbs := 0
	for _, d := range devs {
		fmt.Printf("device %s (%s, usable %v)\n", d.Name, d.Provider, d.Usable)
		if d.Provider == rdma.ProviderVerbs {
			verbs++
		}
	}
	fmt.Printf("verbs devices: %d\n", verbs)
}
GO

export GOFLAGS=-mod=mod
# One empty cache for both builds: the second reuses the standard
# library's objects, and what needs the headers is built afresh by cgo.
export GOCACHE=$work/cache
for cgo in 1 0; do
  echo "== CGO_ENABLED=$cgo, no rdma-core headers, empty build cache"
  CGO_ENABLED=$cgo go build -o "app$cgo" .
  go version -m "app$cgo" | grep -q "CGO_ENABLED=$cgo" || { echo "app$cgo: not built with CGO_ENABLED=$cgo" >&2; exit 1; }
  out=$("./app$cgo")
  echo "$out"
  # This host has no RDMA device: the program must say so, not fail.
  echo "$out" | grep -qx 'verbs devices: 0' || { echo "app$cgo: expected no verbs device" >&2; exit 1; }
done
echo "noheaders: ok"
