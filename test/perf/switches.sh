#!/bin/bash
# What deschedules the latency tools' threads, in ONE VM run
# (test/vm/run.sh): perftest and rdmaperf (--api verbs and async, and
# async at BASE with -B) run a latency test on rxe0/rxe1 under a
# system-wide `perf record` of every sched:sched_switch with call chains,
# and of uprobes on the Go runtime's handoffp (a P handed to another
# thread: by sysmon when it retakes one). Prints per run the tool's row
# (#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9% in
# usec), then, for the tool's processes (server and client): all their
# context switches, sysmon's sleeps (runtime.usleep from runtime.sysmon),
# sysmon's retakes (handoffp from sysmon), and the most frequent call
# chains (user frames only, innermost first). With -S, instead: the
# scheduler's record of the run (`perf sched record`) and, per command,
# how long its threads waited for a CPU once woken (`perf sched latency`:
# switches, average and largest delay), the async API also with --poll
# adaptive. With -W, instead: every sched:sched_wakeup and sched_switch
# with call chains, and per run the tool's threads' switches (how many
# were preemptions, the thread still runnable), what woke them, and where
# the CPUs' time went during rdmaperf's slow round trips (test/perf/wakes.py).
#
# Usage: test/perf/switches.sh [-r ROUNDS] [-n ITERS] [-T TEST] [-B BASE] [-S | -W]
#   ROUNDS (2), ITERS (2000), TEST send_lat or write_lat (send_lat),
#   BASE a revision whose async API runs beside (e.g. 7ecbba6)
# Needs what test/vm/setup.sh installs, plus linux-perf (installed here).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=2 N=2000 TEST=send_lat BASE= SCHED=0
while getopts ":r:n:T:B:SW" opt; do
  case $opt in
    r) ROUNDS=$OPTARG ;;
    n) N=$OPTARG ;;
    T) TEST=$OPTARG ;;
    B) BASE=$OPTARG ;;
    S) SCHED=1 ;;
    W) SCHED=2 ;;
    *) sed -n '2,28p' "$0" >&2; exit 2 ;;
  esac
done
case $TEST in send_lat | write_lat) ;; *) echo "switches.sh: -T send_lat or write_lat" >&2; exit 2 ;; esac
command -v perf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q linux-perf >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/job"
(cd "$ROOT" && CGO_ENABLED=1 go build -o "$tmp/job/rdmaperf-head" ./cmd/rdmaperf)
[ -z "$BASE" ] || "$ROOT/test/perf/rdmaperf-at.sh" "$BASE" "$tmp/job/rdmaperf-base"
cat > "$tmp/job/guest.sh" <<'GUEST'
set -u
ROUNDS=$1 N=$2 TEST=$3 SCHED=$4 IP0=$RDMA_VM_IP0 GIDX=$RDMA_VM_GID_INDEX
kind=${TEST%_lat}
for b in /job/rdmaperf-*; do
  perf probe -q -x "$b" runtime.handoffp >/dev/null 2>&1
  [ "$SCHED" = 2 ] && perf probe -q -x "$b" 'slowrt=main.slowRoundTrip d=%ax:s64' >/dev/null 2>&1
done
# run NAME COMM PORT SERVER CLIENT
run() {
  local name=$1 comm=$2 port=$3 srv=$4 cli=$5 sp
  timeout 120 bash -c "$srv" > /tmp/s.out 2>&1 &
  sp=$!
  if [ "$SCHED" = 1 ]; then
    perf sched record -q -a -o /tmp/p.data -- bash -c "
      for i in \$(seq 60); do timeout 120 bash -c '$cli' > /tmp/c.out 2>&1 && exit 0; sleep 0.25; done; exit 1" >/dev/null 2>&1
    wait "$sp"
    echo "=== $name: $(awk '$1 ~ /^[0-9]+$/ && NF >= 8' /tmp/c.out | tail -1)"
    # The tool's threads: runtime, switches, average and largest delay.
    perf sched latency -i /tmp/p.data --sort max 2>/dev/null | grep -F " ${comm:0:15}" | awk -F'|' '{ print "   " $1 "|" $2 "|" $3 "|" $4 "|" $5 }'
    return
  fi
  if [ "$SCHED" = 2 ]; then
    # The client starts once the server listens: a record of clients
    # started before would count their start-ups.
    for i in $(seq 240); do ss -ltn | grep -q ":$port " && break; sleep 0.25; done
    perf record -q -e sched:sched_switch -e sched:sched_wakeup -e 'probe_rdmaperf*:slowrt' -g -a -o /tmp/p.data -- bash -c "
      for i in \$(seq 60); do timeout 120 bash -c '$cli' > /tmp/c.out 2>&1 && exit 0; sleep 0.25; done; exit 1" >/dev/null 2>&1
    wait "$sp"
    echo "=== $name: $(awk '$1 ~ /^[0-9]+$/ && NF >= 8' /tmp/c.out | tail -1)"
    perf script -i /tmp/p.data -F comm,pid,tid,cpu,time,event,trace,ip,sym 2>/dev/null | python3 /job/wakes.py "$comm"
    return
  fi
  perf record -q -e sched:sched_switch -e 'probe_rdmaperf*:*' -g -a -o /tmp/p.data -- bash -c "
    for i in \$(seq 60); do timeout 120 bash -c '$cli' > /tmp/c.out 2>&1 && exit 0; sleep 0.25; done; exit 1" >/dev/null 2>&1
  wait "$sp"
  echo "=== $name: $(awk '$1 ~ /^[0-9]+$/ && NF >= 8' /tmp/c.out | tail -1)"
  # One line per event: its name, then its user frames, innermost first.
  perf script -i /tmp/p.data --comm "$comm" -F event,ip,sym 2>/dev/null | awk '
    function flush() { if (ev != "") print ev "\t" chain; ev = ""; chain = ""; n = 0 }
    /^ *[a-z_]+:[a-z_]+/ { flush(); ev = $1; sub(/:$/, "", ev); next }
    NF >= 2 && $1 ~ /^[0-9a-f]+$/ { if ($1 !~ /^ffffffff/ && n < 5) { chain = chain (n++ ? " < " : "") $2 } next }
    /^$/ { flush() }
    END { flush() }' > /tmp/ev.txt
  awk -F'\t' '
    $1 == "sched:sched_switch" { all++; if ($2 ~ /^runtime.usleep.* < runtime.sysmon/) sl++ }
    $1 ~ /^probe_rdmaperf/ && $2 ~ /runtime.sysmon/ { rt++ }
    END { printf "    switches %d, sysmon sleeps %d, sysmon retakes %d\n", all, sl, rt }' /tmp/ev.txt
  awk -F'\t' '$1 == "sched:sched_switch" && $2 != "" { c[$2]++ } END { for (k in c) print c[k], k }' /tmp/ev.txt |
    sort -rn | head -6 | sed 's/^/    /'
}
for r in $(seq "$ROUNDS"); do
  run perftest "ib_${kind}_lat" 18515 "ib_${kind}_lat -d rxe0 -x $GIDX -F -s 8 -n $N" "ib_${kind}_lat -d rxe1 -x $GIDX -F -s 8 -n $N $IP0"
  for t in verbs async async@base; do
    b=/job/rdmaperf-head api=${t%@base}
    [ "$t" = async@base ] && b=/job/rdmaperf-base
    [ -x "$b" ] || continue
    run "$t" "${b##*/}" 18600 "$b $TEST --api $api -d rxe0 -p 18600 -s 8 -n $N" "$b $TEST --api $api -d rxe1 -p 18600 -s 8 -n $N $IP0"
  done
  [ "$SCHED" != 0 ] && run async_adaptive rdmaperf-head 18600 "/job/rdmaperf-head $TEST --api async --poll adaptive -d rxe0 -p 18600 -s 8 -n $N" \
    "/job/rdmaperf-head $TEST --api async --poll adaptive -d rxe1 -p 18600 -s 8 -n $N $IP0"
done
GUEST
cp "$ROOT/test/perf/wakes.py" "$tmp/job/"
files=(-f "$tmp/job/rdmaperf-head" -f "$tmp/job/wakes.py")
[ -z "$BASE" ] || files+=(-f "$tmp/job/rdmaperf-base")
TIMEOUT=${TIMEOUT:-900} "$ROOT/test/vm/run.sh" "${files[@]}" "$tmp/job/guest.sh" "$ROUNDS" "$N" "$TEST" "$SCHED"
