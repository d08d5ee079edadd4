#!/bin/bash
# The async API against the raw verbs path on the soft provider, between
# two processes of this host (no VM, no device): rdmaperf's server and
# client on 127.0.0.1, the tools alternating in rounds so that each sees
# the same machine.
#
# Bandwidth tests (write_bw, default): tools verbs (the raw path, busy
# polling), async (rdmaperf's default poll mode, busy) and async_adaptive
# (--poll adaptive, the library's default); prints each run's row and,
# per size, the median of each tool's average bandwidth (MiB/s) and its
# ratio to the raw path's.
# Latency tests (send_lat): tools async_adaptive and stream (--api
# stream, adaptive); prints the median of each tool's typical latency
# (half the round trip, µs).
# A run that fails (server or client) is counted, with its error, and the
# rounds go on; the script then exits 1.
#
# Usage: test/perf/soft-pair.sh [-r ROUNDS] [-n ITERS] [-s "SIZES"] [-T TEST] [-l POSTLIST] [-B BASE] [-c "SCPUS CCPUS"] [-t "TOOLS"]
#   ROUNDS (5), ITERS per run (20000; 5000 for latency), SIZES in bytes
#   ("4096 65536"; "64" for latency), TEST an rdmaperf test (write_bw),
#   POSTLIST the WRs per post of both paths (the async API's Batch size;
#   64; bandwidth only), BASE a revision whose rdmaperf runs each tool
#   too (its rows say base_TOOL; the medians then include TOOL/base),
#   SCPUS and CCPUS the CPUs (taskset lists) of the server and the client:
#   "0 0" puts both on one CPU, "0 1" on one each (default: unpinned).
#   On 2 vCPUs the placement decides a ping-pong's latency (wakes across
#   CPUs), so compare tools in one placement.
#   TOOLS the tools to run instead of the test's (verbs, async,
#   async_adaptive, stream): -T send_lat -t verbs runs the raw path's
#   ping-pong, which the latency tools leave out (below).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=5 N="" SIZES="" TEST=write_bw L=64 BASE="" CPUS="" TOOLS=""
while getopts ":r:n:s:T:l:B:c:t:" opt; do
  case $opt in
    r) ROUNDS=$OPTARG ;;
    n) N=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    T) TEST=$OPTARG ;;
    l) L=$OPTARG ;;
    B) BASE=$OPTARG ;;
    c) CPUS=$OPTARG ;;
    t) TOOLS=$OPTARG ;;
    *) sed -n '2,31p' "$0" >&2; exit 2 ;;
  esac
done
lat=0
case $TEST in *_lat) lat=1 ;; esac
if [ "$lat" = 1 ]; then
  # Not the raw path: its client and server both spin, and two spinning
  # processes on 2 cores measure the kernel's scheduler (pinned, a round
  # trip takes its 10 ms time slices; unpinned, 99th percentiles of 1 ms
  # and more).
  N=${N:-5000} SIZES=${SIZES:-64} tools="async_adaptive stream"
else
  N=${N:-20000} SIZES=${SIZES:-"4096 65536"} tools="verbs async async_adaptive"
fi
tools=${TOOLS:-$tools}
spin=() cpin=()
if [ -n "$CPUS" ]; then
  read -r scpu ccpu <<< "$CPUS"
  spin=(taskset -c "$scpu") cpin=(taskset -c "${ccpu:-$scpu}")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$ROOT" && go build -o "$tmp/rdmaperf" ./cmd/rdmaperf)
if [ -n "$BASE" ]; then
  "$ROOT/test/perf/rdmaperf-at.sh" "$BASE" "$tmp/rdmaperf.base"
  all=""
  for t in $tools; do all="$all $t base_$t"; done
  tools=$all
fi
port=$((10000 + RANDOM % 20000)) # below the ephemeral range (32768-)
# run TOOL SIZE: one server/client pair; prints the client's average
# MiB/s (bandwidth) or typical µs (latency)
run() {
  local tool=$1 size=$2 sp row bin=$tmp/rdmaperf args col
  case $tool in base_*) bin=$tmp/rdmaperf.base tool=${tool#base_} ;; esac
  case $tool in
    verbs) args=(--api verbs) ;;
    async) args=(--api async) ;;
    async_adaptive) args=(--api async --poll adaptive) ;;
    stream) args=(--api stream --poll adaptive) ;;
  esac
  [ "$lat" = 1 ] || args+=(-l "$L")
  port=$((port + 2))
  timeout 120 "${spin[@]}" "$bin" "$TEST" --provider soft "${args[@]}" -p "$port" -s "$size" -n "$N" --no_progress > "$tmp/s.out" 2>&1 &
  sp=$!
  for _ in $(seq 80); do
    kill -0 "$sp" 2>/dev/null || break # the server failed (below)
    timeout 120 "${cpin[@]}" "$bin" "$TEST" --provider soft "${args[@]}" -p "$port" -s "$size" -n "$N" --no_progress 127.0.0.1 > "$tmp/c.out" 2>&1 && break
    sleep 0.05
  done
  wait "$sp" || { echo "soft-pair.sh: $1 server failed: $(grep 'rdmaperf:' "$tmp/s.out" | tail -1)" >&2; return 1; }
  row=$(awk '$1 ~ /^[0-9]+$/ && NF >= 5' "$tmp/c.out" | tail -1)
  [ -n "$row" ] || { echo "soft-pair.sh: $1 client printed no row: $(grep 'rdmaperf:' "$tmp/c.out" | tail -1)" >&2; return 1; }
  echo "R $1 $row" >&2
  col=4
  [ "$lat" = 1 ] && col=5 # t_typical
  echo "$row" | awk -v c=$col '{print $c}'
}
unit="MiB/s"
[ "$lat" = 1 ] && unit="µs typical"
echo "$TEST on soft between two processes, $N iterations, $ROUNDS rounds, CPUs ${CPUS:-unpinned} (host load $(cut -d' ' -f1-3 /proc/loadavg))"
med() { sort -g "$1" | awk '{a[NR]=$1} END {if (NR) print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
set -- $tools
ntools=$#
for size in $SIZES; do
  for t in $tools; do : > "$tmp/$t"; done
  for r in $(seq "$ROUNDS"); do
    # rotate which tool goes first
    set -- $tools
    k=$(( r % ntools ))
    order="${*:k+1} ${*:1:k}"
    for t in $order; do run "$t" "$size" >> "$tmp/$t" || echo "$t $size" >> "$tmp/failed"; done
  done
  # ratio A B: A/B, or nothing when either is missing (every run failed)
  ratio() { if [ -n "$1" ] && [ -n "$2" ]; then echo "$1 $2" | awk '{printf "%.2f×", $1/$2}'; fi; }
  v=$( [ "$lat" = 1 ] || med "$tmp/verbs" 2>/dev/null || true)
  for t in $tools; do
    a=$(med "$tmp/$t")
    line="size $size: $t $a $unit (median; per round $(tr '\n' ' ' < "$tmp/$t"))"
    case $t in
      verbs|base_verbs) ;;
      base_*) [ "$lat" = 1 ] || [ -z "$v" ] || { b=$(med "$tmp/base_verbs"); line="$line; against base raw $b: $(ratio "$a" "$b")"; } ;;
      *) [ "$lat" = 1 ] || [ -z "$v" ] || line="$line; against raw $v: $(ratio "$a" "$v")" ;;
    esac
    if [ -n "$BASE" ] && [ "${t#base_}" = "$t" ]; then
      b=$(med "$tmp/base_$t")
      line="$line; against base $b: $(ratio "$a" "$b")"
    fi
    f=$(grep -cx "$t $size" "$tmp/failed" 2>/dev/null || true)
    [ "${f:-0}" = 0 ] || line="$line; failed runs: $f of $ROUNDS"
    echo "$line"
  done
done
# A failed run is an error (its message went to stderr above).
[ ! -s "$tmp/failed" ]
