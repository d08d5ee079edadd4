#!/bin/bash
# Builds cmd/rdmaperf as it is at revision REV into the file OUT, from a
# temporary git worktree that is gone when it returns. The perf scripts'
# -B BASE runs this build beside the work tree's.
#
# Usage: test/perf/rdmaperf-at.sh REV OUT
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -eq 2 ] || { sed -n '2,6p' "$0" >&2; exit 2; }
rev=$(git -C "$ROOT" rev-parse --verify "$1^{commit}") || { echo "rdmaperf-at.sh: no revision $1" >&2; exit 2; }
out=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
tree=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$tree" >/dev/null 2>&1 || true; rm -rf "$tree"' EXIT
rmdir "$tree"
git -C "$ROOT" worktree add --detach -q "$tree" "$rev"
(cd "$tree" && CGO_ENABLED=1 go build -o "$out" ./cmd/rdmaperf)
