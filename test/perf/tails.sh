#!/bin/bash
# What the async API's latency tail (send_lat, 8 B) depends on, in ONE VM
# run (test/vm/run.sh): perftest's ib_send_lat, then rdmaperf send_lat
# --api async under variants of the Go runtime's settings, ROUNDS times,
# each with the pollers' counters of both sides (--stats). Prints one row
# per run (#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%,
# in usec) and the counters.
#
# Usage: test/perf/tails.sh [-r ROUNDS] [-n ITERS]
#   variants: default; GOGC=off (no GC cycle); GODEBUG=asyncpreemptoff=1
#   (no asynchronous preemption); GOMAXPROCS=1
# Needs what test/vm/setup.sh installs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=2 N=3000
while getopts ":r:n:" opt; do
  case $opt in
    r) ROUNDS=$OPTARG ;;
    n) N=$OPTARG ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$ROOT" && CGO_ENABLED=1 go build -o "$tmp/rdmaperf" ./cmd/rdmaperf)
cat > "$tmp/tails-guest.sh" <<'GUEST'
set -u
ROUNDS=$1 N=$2 P=/job/rdmaperf IP0=$RDMA_VM_IP0 GIDX=$RDMA_VM_GID_INDEX
row() { awk '$1 ~ /^[0-9]+$/ && NF >= 8' "$1" | tail -1; }
pair() { # name srv cli
  timeout 120 bash -c "$2" > /tmp/s.out 2>&1 &
  local sp=$! i
  for i in $(seq 60); do timeout 120 bash -c "$3" > /tmp/c.out 2>&1 && break; sleep 0.25; done
  wait "$sp"
  echo "$1: $(row /tmp/c.out)"
  grep -h 'pollers' /tmp/c.out /tmp/s.out | sed 's/^rdmaperf: /    /'
}
echo "cols: #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9% [usec]"
for r in $(seq "$ROUNDS"); do
  pair perftest "ib_send_lat -d rxe0 -x $GIDX -F -s 8 -n $N" "ib_send_lat -d rxe1 -x $GIDX -F -s 8 -n $N $IP0"
  for v in "default" "GOGC=off" "GODEBUG=asyncpreemptoff=1" "GOMAXPROCS=1"; do
    e=$v; [ "$v" = default ] && e=
    pair "async $v" "env $e $P send_lat --api async --stats -d rxe0 -p 18600 -s 8 -n $N" \
      "env $e $P send_lat --api async --stats -d rxe1 -p 18600 -s 8 -n $N $IP0"
  done
done
GUEST
TIMEOUT=${TIMEOUT:-900} "$ROOT/test/vm/run.sh" -f "$tmp/rdmaperf" "$tmp/tails-guest.sh" "$ROUNDS" "$N"
