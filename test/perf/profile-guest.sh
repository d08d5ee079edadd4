#!/bin/bash
# Guest job of test/perf/profile.sh: perftest and rdmaperf (verbs, async)
# on rxe0/rxe1 with the same parameters, each pair run under a
# system-wide `perf record` (cpu-clock: TCG has no hardware counters) and
# the client under `perf stat`. Prints, per point and tool:
#   P TEST TOOL stat: task-clock, context switches, migrations, wall
#   the top of `perf report` by command/shared object, and the tool's
#   top symbols (both of its processes).
# Usage (in the guest): profile-guest.sh "POINTS" [N_MR]   (default: all, 1280)
#   points: write_bw send_bw write_mr send_lat write_lat ud_send_bw ud_send_lat
#           stream_bw (rsockets' rstream against the stream, 300 transfers
#           of 64 KiB, as compare.sh's rstream point, and the async API's
#           send_bw beside them)
#   N_MR: iterations of write_mr
set -uo pipefail
POINTS=" ${1:-write_bw send_bw write_mr send_lat write_lat} "
N_MR=${2:-1280}
IP0=${RDMA_VM_IP0:?not in the VM?}
GIDX=${RDMA_VM_GID_INDEX:?}
PERF=/job/rdmaperf
want() { [[ $POINTS == *" $1 "* ]]; }

# prof POINT TOOL CLIENT_COMM SERVER_CMD CLIENT_CMD
prof() {
  local point=$1 tool=$2 comm=$3 srv=$4 cli=$5 sp
  timeout 120 bash -c "$srv" > /tmp/server.out 2>&1 &
  sp=$!
  # the server listens before the client connects: retry the client
  perf record -q -a -g -F 997 -o /tmp/perf.data -- bash -c "
    for i in \$(seq 60); do
      timeout 120 perf stat -x, -e task-clock,context-switches,cpu-migrations -o /tmp/stat.out -- $cli > /tmp/client.out 2>&1 && exit 0
      kill -0 $sp 2>/dev/null || exit 1
      sleep 0.25
    done; exit 1" 2>/dev/null
  local crc=$?
  wait "$sp"
  echo "=== $point $tool (client exit $crc, server exit $?)"
  awk -F, '$3 ~ /task-clock|context-switches|cpu-migrations/ {printf "P %s %s %s %s\n", "'"$point"'", "'"$tool"'", $3, $1}' /tmp/stat.out
  grep -E '^ *[0-9]+ +[0-9]' /tmp/client.out | head -2 | sed "s/^/T $point $tool /"
  # rstream's: name size xfers iters bytes seconds Gb/sec usec/xfer
  awk 'NF == 8 && $7 ~ /^[0-9.]+$/' /tmp/client.out | sed "s/^/T $point $tool /"
  echo "--- by command and object (all CPUs)"
  perf report -i /tmp/perf.data --stdio --no-children --sort comm,dso -g none 2>/dev/null |
    grep -E '^ +[0-9.]+%' | head -12
  echo "--- $comm (server and client) symbols"
  perf report -i /tmp/perf.data --stdio --no-children --comm "$comm" --sort dso,sym -g none 2>/dev/null |
    grep -E '^ +[0-9.]+%' | head -25
  # the idle task's samples: halted (idle) or softirq work (rxe's
  # packets) that ran while the CPU had nothing else
  echo "--- swapper symbols"
  perf report -i /tmp/perf.data --stdio --no-children --comm swapper --sort sym -g none 2>/dev/null |
    grep -E '^ +[0-9.]+%' | head -8
}

echo "guest: $(nproc) CPUs, $(uname -r), perf $(perf version 2>&1 | head -1)"
for p in $POINTS; do
  if [ "$p" = stream_bw ]; then
    ip1=${RDMA_VM_IP1:?}
    prof "$p" rstream rstream \
      "rstream -b $IP0 -S 65536 -C 300 -I 1" \
      "rstream -s $IP0 -b $ip1 -S 65536 -C 300 -I 1"
    for api in stream async; do
      prof "$p" "$api" rdmaperf \
        "$PERF send_bw --api $api -d rxe0 -p 18600 -s 65536 -n 300" \
        "$PERF send_bw --api $api -d rxe1 -p 18600 -s 65536 -n 300 $IP0"
    done
    continue
  fi
  case $p in
  write_bw | send_bw) t=${p%_bw} args="-s 65536 -n 300" ;;
  write_mr) t=write args="-s 2 -n $N_MR -l 64 -Q 32" ;;
  send_lat | write_lat) t=${p%_lat} args="-s 8 -n 2000" ;;
  # over UD (-c UD, both tools' flag): 1 KiB, rxe's MTU over the veths
  ud_send_bw) t=send args="-c UD -s 1024 -n 10000" ;;
  ud_send_lat) t=send args="-c UD -s 8 -n 2000" ;;
  *) echo "unknown point $p"; continue ;;
  esac
  kind=bw; [[ $p == *_lat ]] && kind=lat
  prof "$p" perftest "ib_${t}_${kind}" \
    "ib_${t}_${kind} -d rxe0 -x $GIDX -F $args" \
    "ib_${t}_${kind} -d rxe1 -x $GIDX -F $args $IP0"
  for api in verbs async; do
    prof "$p" "$api" rdmaperf \
      "$PERF ${t}_${kind} --api $api -d rxe0 -p 18600 $args" \
      "$PERF ${t}_${kind} --api $api -d rxe1 -p 18600 $args $IP0"
  done
  # the message rate through Futures, one post each (compare.sh's
  # async_futures)
  [ "$p" = write_mr ] && prof "$p" async_futures rdmaperf \
    "$PERF write_bw --api async --poll adaptive -d rxe0 -p 18600 -s 2 -n $N_MR" \
    "$PERF write_bw --api async --poll adaptive -d rxe1 -p 18600 -s 2 -n $N_MR -l 1 $IP0"
done
