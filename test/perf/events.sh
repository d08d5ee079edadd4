#!/bin/bash
# The completion event path on rxe, in ONE VM run (test/vm/run.sh): an 8 B
# SEND ping-pong (send_lat) by perftest polling its CQ, by perftest
# waiting for completion events (ib_send_lat -e), and by rdmaperf's async
# API with each poll mode (--poll busy, adaptive, event), ROUNDS times,
# with the pollers' counters of both sides (--stats) and the client's
# context switches and CPU time (perf stat). Under TCG a round
# trip outlasts an Adaptive poller's 50 µs spin, so Adaptive parks as
# Event does, and both pay the event path that perftest -e pays.
# Prints one row per run (#bytes #iterations t_min t_max t_typical t_avg
# t_stdev 99% 99.9%, in usec) and the counters. With -B, rdmaperf built
# at BASE runs each poll mode too ("async@base"), beside the work tree's.
#
# Usage: test/perf/events.sh [-r ROUNDS] [-n ITERS] [-B BASE]
# Needs what test/vm/setup.sh installs, plus linux-perf (installed here).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=2 N=2000 BASE=
while getopts ":r:n:B:" opt; do
  case $opt in
    r) ROUNDS=$OPTARG ;;
    n) N=$OPTARG ;;
    B) BASE=$OPTARG ;;
    *) sed -n '2,16p' "$0" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/job"
(cd "$ROOT" && CGO_ENABLED=1 go build -o "$tmp/job/rdmaperf" ./cmd/rdmaperf)
[ -z "$BASE" ] || "$ROOT/test/perf/rdmaperf-at.sh" "$BASE" "$tmp/job/rdmaperf-base"
cat > "$tmp/job/events-guest.sh" <<'GUEST'
set -u
command -v perf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q linux-perf >/dev/null 2>&1
ROUNDS=$1 N=$2 P=/job/rdmaperf IP0=$RDMA_VM_IP0 GIDX=$RDMA_VM_GID_INDEX
row() { awk '$1 ~ /^[0-9]+$/ && NF >= 8' "$1" | tail -1; }
pair() { # name srv cli
  timeout 120 bash -c "$2" > /tmp/s.out 2>&1 &
  local sp=$! i
  for i in $(seq 60); do
    timeout 120 perf stat -x, -e context-switches,task-clock -o /tmp/stat.out -- bash -c "$3" > /tmp/c.out 2>&1 && break
    sleep 0.25
  done
  wait "$sp"
  echo "$1: $(row /tmp/c.out)"
  awk -F, '$3 == "context-switches" { cs = $1 } $3 == "task-clock" { ms = $1 }
    END { printf "    client: %d context switches, %.0f ms of CPU\n", cs, ms }' /tmp/stat.out
  grep -h 'pollers' /tmp/c.out /tmp/s.out | sed 's/^rdmaperf: /    /'
}
echo "cols: #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9% [usec]"
for r in $(seq "$ROUNDS"); do
  pair perftest "ib_send_lat -d rxe0 -x $GIDX -F -s 8 -n $N" "ib_send_lat -d rxe1 -x $GIDX -F -s 8 -n $N $IP0"
  pair "perftest -e" "ib_send_lat -e -d rxe0 -x $GIDX -F -s 8 -n $N" "ib_send_lat -e -d rxe1 -x $GIDX -F -s 8 -n $N $IP0"
  for m in busy adaptive event; do
    for b in /job/rdmaperf /job/rdmaperf-base; do
      [ -x "$b" ] || continue
      name="async $m"; [ "$b" = /job/rdmaperf-base ] && name="async@base $m"
      pair "$name" "$b send_lat --api async --poll $m --stats -d rxe0 -p 18600 -s 8 -n $N" \
        "$b send_lat --api async --poll $m --stats -d rxe1 -p 18600 -s 8 -n $N $IP0"
    done
  done
done
GUEST
files=(-f "$tmp/job/rdmaperf")
[ -z "$BASE" ] || files+=(-f "$tmp/job/rdmaperf-base")
TIMEOUT=${TIMEOUT:-900} "$ROOT/test/vm/run.sh" "${files[@]}" "$tmp/job/events-guest.sh" "$ROUNDS" "$N"
