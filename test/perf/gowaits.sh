#!/bin/bash
# Where a soft benchmark's slow waits go: runs one benchmark of the root
# package (a Future.Wait loop, on soft) with a Go execution trace, under a
# system-wide `perf record` of sched:sched_switch and sched:sched_wakeup
# with call chains, and prints test/perf/gowaits.py's account: the
# waiter's waits (percentiles of the whole wait and of the readied-to-
# running delay), what kind the slow ones were, and where the kernel
# switched the benchmark's threads out and what they woke. With -B, the
# same for BASE's tree (built in a temporary worktree) after the work
# tree's. First, test/perf/stalls: how often this machine takes a CPU
# from a thread that never blocks, the floor under the tail. Tracing
# slows every wait: compare trees in one run, and take the benchmark's
# own p99 from scripts/bench-ab.sh.
#
# Usage: test/perf/gowaits.sh [-b PATTERN] [-n OPS] [-s SLOW_US] [-B BASE]
#   PATTERN 'Write/future/64KiB/qd1$', OPS 20000, SLOW_US 15
# Runs on the host; needs perf (linux-perf) and python3.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PATTERN='Write/future/64KiB/qd1$' OPS=20000 SLOW=15 BASE=
while getopts ":b:n:s:B:" opt; do
  case $opt in
    b) PATTERN=$OPTARG ;;
    n) OPS=$OPTARG ;;
    s) SLOW=$OPTARG ;;
    B) BASE=$OPTARG ;;
    *) sed -n '2,18p' "$0" >&2; exit 2 ;;
  esac
done
command -v perf >/dev/null || { echo "gowaits.sh: needs perf (apt-get install linux-perf)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$tmp/base-tree" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
(cd "$ROOT" && go test -c -o "$tmp/head.test" .)
if [ -n "$BASE" ]; then
  git -C "$ROOT" worktree add -q --detach "$tmp/base-tree" "$BASE"
  (cd "$tmp/base-tree" && go test -c -o "$tmp/base.test" .)
fi
# The machine's own stalls, the floor under every tail: two threads that
# never block, as the benchmark's waiter and poller are while it runs.
(cd "$ROOT" && go run ./test/perf/stalls -n 2 -d 1s)
for tree in head ${BASE:+base}; do
  bin=$tmp/$tree.test
  [ "$tree" = base ] && echo "== BASE $BASE" || echo "== work tree"
  (cd "$tmp" && perf record -q -g -k CLOCK_MONOTONIC -e sched:sched_switch -e sched:sched_wakeup -a -o "$tmp/$tree.perf" -- \
    "$bin" -test.run '^$' -test.bench "$PATTERN" -test.benchtime "${OPS}x" -test.trace "$tmp/$tree.trace" 2>&1 | grep '^Benchmark' || true)
  go tool trace -d=parsed "$tmp/$tree.trace" > "$tmp/$tree.parsed"
  perf script -i "$tmp/$tree.perf" -F comm,tid,cpu,time,event,trace,ip,sym --ns > "$tmp/$tree.script" 2>/dev/null
  python3 "$ROOT/test/perf/gowaits.py" "$tmp/$tree.parsed" "$tmp/$tree.script" "$SLOW"
done
