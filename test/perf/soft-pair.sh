#!/bin/bash
# The async API against the raw verbs path on the soft provider, between
# two processes of this host (no VM, no device): rdmaperf's server and
# client on 127.0.0.1, the tools alternating in rounds so that each sees
# the same machine. Tools: verbs (the raw path, busy polling), async
# (rdmaperf's default poll mode, busy) and async_adaptive (--poll
# adaptive, the library's default). Prints each run's row and, per size,
# the median of each tool's average bandwidth (MiB/s) and its ratio to
# the raw path's.
#
# Usage: test/perf/soft-pair.sh [-r ROUNDS] [-n ITERS] [-s "SIZES"] [-T TEST] [-l POSTLIST]
#   ROUNDS (5), ITERS per run (20000), SIZES in bytes ("4096 65536"),
#   TEST an rdmaperf bandwidth test (write_bw), POSTLIST the WRs per post
#   of both paths (the async API's Batch size; 64)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=5 N=20000 SIZES="4096 65536" TEST=write_bw L=64
while getopts ":r:n:s:T:l:" opt; do
  case $opt in
    r) ROUNDS=$OPTARG ;;
    n) N=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    T) TEST=$OPTARG ;;
    l) L=$OPTARG ;;
    *) sed -n '2,11p' "$0" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$ROOT" && go build -o "$tmp/rdmaperf" ./cmd/rdmaperf)
port=$((20000 + RANDOM % 20000))
# run TOOL SIZE: one server/client pair; prints the client's average MiB/s
run() {
  local tool=$1 size=$2 sp row args
  case $tool in
    verbs) args=(--api verbs) ;;
    async) args=(--api async) ;;
    async_adaptive) args=(--api async --poll adaptive) ;;
  esac
  port=$((port + 2))
  timeout 120 "$tmp/rdmaperf" "$TEST" --provider soft "${args[@]}" -p "$port" -s "$size" -n "$N" -l "$L" --no_progress > "$tmp/s.out" 2>&1 &
  sp=$!
  for _ in $(seq 80); do
    timeout 120 "$tmp/rdmaperf" "$TEST" --provider soft "${args[@]}" -p "$port" -s "$size" -n "$N" -l "$L" --no_progress 127.0.0.1 > "$tmp/c.out" 2>&1 && break
    sleep 0.05
  done
  wait "$sp" || { echo "soft-pair.sh: $tool server failed:" >&2; cat "$tmp/s.out" >&2; exit 1; }
  row=$(awk '$1 ~ /^[0-9]+$/ && NF >= 5' "$tmp/c.out" | tail -1)
  [ -n "$row" ] || { echo "soft-pair.sh: $tool client printed no row:" >&2; cat "$tmp/c.out" >&2; exit 1; }
  echo "R $tool $row" >&2
  echo "$row" | awk '{print $4}'
}
echo "$TEST on soft between two processes, post list $L, $N iterations, $ROUNDS rounds (host load $(cut -d' ' -f1-3 /proc/loadavg))"
for size in $SIZES; do
  tools="verbs async async_adaptive"
  for t in $tools; do : > "$tmp/$t"; done
  for r in $(seq "$ROUNDS"); do
    # rotate which tool goes first
    case $((r % 3)) in
      1) order="verbs async async_adaptive" ;;
      2) order="async async_adaptive verbs" ;;
      0) order="async_adaptive verbs async" ;;
    esac
    for t in $order; do run "$t" "$size" >> "$tmp/$t"; done
  done
  med() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
  v=$(med "$tmp/verbs")
  for t in async async_adaptive; do
    a=$(med "$tmp/$t")
    printf "size %s: %s %s MiB/s against raw %s (medians): %.2f×; per round %s\n" "$size" "$t" "$a" "$v" \
      "$(echo "$a $v" | awk '{print $1/$2}')" "$(paste "$tmp/$t" "$tmp/verbs" | awk '{printf "%.2f ", $1/$2}')"
  done
done
