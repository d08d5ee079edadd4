#!/usr/bin/env bash
# Follows docs/guide.md's "Getting started" as a new user would, in a
# clean directory outside the repository: it runs the guide's shell blocks
# and writes its files, taken from the guide itself (the blocks after
# <!-- guide:sh NAME --> and <!-- guide:file NAME --> markers), so the
# guide cannot drift from what works.
#
# One substitution: `go get github.com/go-rdma/rdma@VERSION` fetches the
# release from the module proxy, and here the module under test is this
# clone, so that line becomes a require of the version plus a replace by
# the clone, and `go mod tidy` fills go.sum once main.go exists. The
# guide's port 7471 becomes a free one: the server listens on port 0 and
# the commands after it use the port it says it serves on (no tool to
# pick a port, such as python3, which a minbase Debian lacks).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
guide=$repo/docs/guide.md
work=$(mktemp -d)
server=""
cleanup() {
  # The server runs in a session of its own: go run's child, the
  # program, does not end with go run.
  if [ -n "$server" ]; then kill -- "-$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# block KIND NAME prints the fenced block that follows the marker.
block() {
  awk -v m="<!-- guide:$1 $2 -->" '
    $0 == m { want = 1; next }
    want && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$guide"
}
for b in "sh setup" "file main.go" "sh run"; do
  if [ -z "$(block $b)" ]; then echo "guide: no block for <!-- guide:$b -->" >&2; exit 1; fi
done

port=0 # until the server says which port it has
cd "$work"
echo "guide: following docs/guide.md in $work"

# Setup, with the go get of the release made a replace by this clone.
while IFS= read -r line; do
  case "$line" in
    "go get github.com/go-rdma/rdma@"*)
      version=${line##*@}
      echo "+ $line   (as: require $version, replace by $repo)"
      go mod edit -require="github.com/go-rdma/rdma@$version" -replace="github.com/go-rdma/rdma=$repo"
      ;;
    *) echo "+ $line"; eval "$line" ;;
  esac
done < <(block sh setup)

block file main.go > main.go
go mod tidy

# Run: the server in the background until it says where it serves, then
# each foreground command, its output kept for the checks below.
n=0
while IFS= read -r line; do
  cmd=${line%%#*}
  cmd=${cmd//7471/$port}
  cmd=$(echo "$cmd" | sed 's/[[:space:]]*$//')
  [ -z "$cmd" ] && continue
  echo "+ $cmd"
  if [[ "$cmd" == *"&" ]]; then
    eval "setsid ${cmd%&} > server.out 2>&1 &"
    server=$!
    for _ in $(seq 600); do # bounded: 60 s, the first go run compiles
      grep -q "serving on" server.out 2>/dev/null && break
      kill -0 "$server" 2>/dev/null || { cat server.out; echo "guide: the server exited" >&2; exit 1; }
      sleep 0.1
    done
    grep -q "serving on" server.out || { cat server.out; echo "guide: the server never served" >&2; exit 1; }
    port=$(sed -n 's/.*serving on .*:\([0-9][0-9]*\)$/\1/p' server.out | head -n 1)
    [ -n "$port" ] || { cat server.out; echo "guide: the server did not say its port" >&2; exit 1; }
    echo "guide: the server is on port $port"
    continue
  fi
  n=$((n + 1))
  timeout 120 bash -c "$cmd" > "out.$n" 2>&1 || { cat "out.$n"; echo "guide: '$cmd' failed" >&2; exit 1; }
  cat "out.$n"
done < <(block sh run)

# What the guide's comments promise.
want() { grep -qF "$2" "out.$1" || { echo "guide: step $1 did not print '$2'" >&2; exit 1; }; }
want 1 "counter was 0"; want 1 "counter was 1"; want 1 "echo: hello over RDMA"
want 2 "counter was 0"; want 2 "counter was 1"
want 3 "GET: 200 OK hello over the RDMA stream"
echo "guide: followed, 3 steps as the guide says"
