#!/bin/bash
# Guest job of test/perf/compare.sh (runs inside the VM of test/vm/run.sh):
# perftest and rdmaperf back to back on the same rxe devices with the same
# parameters, server on rxe0/10.99.0.1, client on rxe1/10.99.0.2.
#
# Usage (in the guest): guest.sh RUNS N_BW N_LAT N_MR BW_SIZES [TESTS [LAT_SIZES [N_UD]]]
# BW_SIZES: write_bw, send_bw and read_bw run at each (bytes).
# TESTS: any of write_bw send_bw read_bw write_mr send_lat write_lat
# (default those), ud_send_bw ud_send_mr ud_send_lat, rstream.
# LAT_SIZES: send_lat and write_lat run at each (default 8).
# N_UD: iterations of ud_send_bw (default 10000).
# The UD points (-c UD, perftest's and rdmaperf's) run send_bw at the
# path MTU (the smaller active MTU of rxe0 and rxe1: 1024 B over the
# veths' 1500), ud_send_mr 2 B datagrams with post lists of 64 (N_MR),
# ud_send_lat at 8 B (N_LAT); their send_bw rows are the receivers', and
# "U RUN TEST TOOL SIZE SENT RECEIVED" lines say how many rdmaperf's
# client sent and its server took.
# Prints one line per measurement, and per run the floor (rdmaperf --floor):
#   F RUN CALL_USEC POLL_USEC
#   R RUN TEST TOOL SIZE peak avg mpps                          (bandwidth)
#   R RUN TEST TOOL SIZE min max typical avg stdev p99 p999     (latency)
# TOOL is perftest, verbs (rdmaperf --api=verbs), async (--api=async),
# async_unlocked (--api=async --poller_lock=false, latency tests only),
# async_adaptive (--api=async --poll adaptive, bandwidth tests only),
# async_futures and async_futures_g4 (write_mr through Futures, from 1
# and 4 goroutines: rdmaperf -l 1 -g N, Adaptive pollers), or
# stream (--api=stream, the net.Conn of stream.Dial: send_bw and
# send_lat only, with the stream's own window: no -t/-l/-Q/-r). With
# /job/rdmaperf.base (compare.sh -B), async@base and stream@base are the
# same points of the base revision's rdmaperf, right after the work
# tree's. With /job/rdmaperf.purego (compare.sh -P), verbs@purego and
# async@purego are the same points of rdmaperf built with CGO_ENABLED=0
# (the purego binding of internal/ibv), right after the cgo build's.
set -uo pipefail
RUNS=${1:-5} N_BW=${2:-1000} N_LAT=${3:-3000} N_MR=${4:-12800} BW_SIZES=${5:-65536}
TESTS=" ${6:-write_bw send_bw read_bw write_mr send_lat write_lat} "
LAT_SIZES=${7:-8}
N_UD=${8:-10000}
want() { [[ $TESTS == *" $1 "* ]]; }
IP0=${RDMA_VM_IP0:?not in the VM?}
GIDX=${RDMA_VM_GID_INDEX:?}
PERF=/job/rdmaperf
BASE=/job/rdmaperf.base
PUREGO=/job/rdmaperf.purego
fails=0

# table FILE: the first row of numbers after the "#bytes" header.
table() { awk '$1=="#bytes"{h=1;next} h && $1 ~ /^[0-9]+$/ {$1=$1; print; exit}' "$1"; }

# pair RUN TEST TOOL SIZE SERVER_CMD CLIENT_CMD
pair() {
  local run=$1 test=$2 tool=$3 size=$4 srv=$5 cli=$6 sp i crc=1 row t0=$SECONDS
  timeout 120 bash -c "$srv" > /tmp/server.out 2>&1 &
  sp=$!
  for ((i = 0; i < 60; i++)); do
    timeout 120 bash -c "$cli" > /tmp/client.out 2>&1 && { crc=0; break; }
    kill -0 "$sp" 2>/dev/null || break
    sleep 0.25
  done
  wait "$sp"
  local src=$?
  # ib_send_bw's client reports 0 in this perftest; its server has the
  # figures. Take the server's row for every tool of send_bw.
  case $test in
    send_bw | rs_send_bw | ud_send_bw | ud_send_mr) row=$(table /tmp/server.out) ;;
    *) row=$(table /tmp/client.out) ;;
  esac
  if [ "$crc" != 0 ] || [ "$src" != 0 ] || [ -z "$row" ]; then
    echo "FAIL $test $tool $size (client $crc, server $src)"
    sed 's/^/  client: /' /tmp/client.out | tail -15
    sed 's/^/  server: /' /tmp/server.out | tail -15
    fails=$((fails + 1))
    return
  fi
  # drop the #bytes and #iterations columns
  echo "R $run $test $tool $size $(echo "$row" | cut -d' ' -f3-)"
  # rdmaperf's receiver over UD: what was sent and what arrived
  awk -v p="U $run $test $tool $size" '$1 == "UD:" {print p, $2, $5}' /tmp/server.out
  echo "T $run $test $tool $size $((SECONDS - t0)) s"
}

# bw RUN TEST(write|send|read) SIZE N [EXTRA...]: the three tools, and the
# stream for send.
bw() {
  local run=$1 t=$2 size=$3 n=$4 name=$2_bw
  shift 4
  local x="$*"
  [ "$name" = write_bw ] && [ "$size" -lt 64 ] && name=write_mr
  pair "$run" "$name" perftest "$size" \
    "ib_${t}_bw -d rxe0 -x $GIDX -F -s $size -n $n --report_gbits $x" \
    "ib_${t}_bw -d rxe1 -x $GIDX -F -s $size -n $n --report_gbits $x $IP0"
  for api in verbs async; do
    pair "$run" "$name" "$api" "$size" \
      "$PERF ${t}_bw --api $api -d rxe0 -p 18600 -s $size -n $n --report_gbits $x" \
      "$PERF ${t}_bw --api $api -d rxe1 -p 18600 -s $size -n $n --report_gbits $x --out_json /tmp/last.json $IP0"
    [ -x "$PUREGO" ] && pair "$run" "$name" "$api@purego" "$size" \
      "$PUREGO ${t}_bw --api $api -d rxe0 -p 18600 -s $size -n $n --report_gbits $x" \
      "$PUREGO ${t}_bw --api $api -d rxe1 -p 18600 -s $size -n $n --report_gbits $x $IP0"
  done
  [ -x "$BASE" ] && pair "$run" "$name" async@base "$size" \
    "$BASE ${t}_bw --api async -d rxe0 -p 18600 -s $size -n $n --report_gbits $x" \
    "$BASE ${t}_bw --api async -d rxe1 -p 18600 -s $size -n $n --report_gbits $x $IP0"
  # the async API with Adaptive pollers, the library's default: Busy
  # pollers spin a thread beside the posting goroutine, which perftest's
  # one thread does not, and on 2 vCPUs that takes the CPU rxe needs
  # (docs/history/performance.md)
  pair "$run" "$name" async_adaptive "$size" \
    "$PERF ${t}_bw --api async --poll adaptive -d rxe0 -p 18600 -s $size -n $n --report_gbits $x" \
    "$PERF ${t}_bw --api async --poll adaptive -d rxe1 -p 18600 -s $size -n $n --report_gbits $x $IP0"
  [ -x "$BASE" ] && pair "$run" "$name" async_adaptive@base "$size" \
    "$BASE ${t}_bw --api async --poll adaptive -d rxe0 -p 18600 -s $size -n $n --report_gbits $x" \
    "$BASE ${t}_bw --api async --poll adaptive -d rxe1 -p 18600 -s $size -n $n --report_gbits $x $IP0"
  # the message rate through Futures rather than Batches: one goroutine
  # posting each WRITE as a Future, tx depth deep (async_futures), and 4
  # goroutines posting at once on the connection, whose posts the async
  # API combines into chains (async_futures_g4)
  if [ "$name" = write_mr ]; then
    for g in 1 4; do
      local tool=async_futures
      [ "$g" -gt 1 ] && tool=async_futures_g$g
      pair "$run" "$name" "$tool" "$size" \
        "$PERF write_bw --api async --poll adaptive -d rxe0 -p 18600 -s $size -n $n --report_gbits" \
        "$PERF write_bw --api async --poll adaptive -d rxe1 -p 18600 -s $size -n $n --report_gbits -l 1 -g $g $IP0"
      [ -x "$BASE" ] && pair "$run" "$name" "$tool@base" "$size" \
        "$BASE write_bw --api async --poll adaptive -d rxe0 -p 18600 -s $size -n $n --report_gbits" \
        "$BASE write_bw --api async --poll adaptive -d rxe1 -p 18600 -s $size -n $n --report_gbits -l 1 -g $g $IP0"
    done
  fi
  # the stream: its figures are the reader's (the server's), as for every
  # tool of send_bw (see pair)
  [ "$name" = send_bw ] && pair "$run" "$name" stream "$size" \
    "$PERF send_bw --api stream -d rxe0 -p 18600 -s $size -n $n --report_gbits" \
    "$PERF send_bw --api stream -d rxe1 -p 18600 -s $size -n $n --report_gbits --out_json /tmp/last.json $IP0"
  [ "$name" = send_bw ] && [ -x "$BASE" ] && pair "$run" "$name" stream@base "$size" \
    "$BASE send_bw --api stream -d rxe0 -p 18600 -s $size -n $n --report_gbits" \
    "$BASE send_bw --api stream -d rxe1 -p 18600 -s $size -n $n --report_gbits $IP0"
  return 0
}

lat() {
  local run=$1 t=$2 size=$3 n=$4
  pair "$run" "${t}_lat" perftest "$size" \
    "ib_${t}_lat -d rxe0 -x $GIDX -F -s $size -n $n" \
    "ib_${t}_lat -d rxe1 -x $GIDX -F -s $size -n $n $IP0"
  for api in verbs async; do
    pair "$run" "${t}_lat" "$api" "$size" \
      "$PERF ${t}_lat --api $api -d rxe0 -p 18600 -s $size -n $n" \
      "$PERF ${t}_lat --api $api -d rxe1 -p 18600 -s $size -n $n --out_json /tmp/last.json $IP0"
    [ -x "$PUREGO" ] && pair "$run" "${t}_lat" "$api@purego" "$size" \
      "$PUREGO ${t}_lat --api $api -d rxe0 -p 18600 -s $size -n $n" \
      "$PUREGO ${t}_lat --api $api -d rxe1 -p 18600 -s $size -n $n $IP0"
  done
  [ -x "$BASE" ] && pair "$run" "${t}_lat" async@base "$size" \
    "$BASE ${t}_lat --api async -d rxe0 -p 18600 -s $size -n $n" \
    "$BASE ${t}_lat --api async -d rxe1 -p 18600 -s $size -n $n $IP0"
  # the library's default poll mode, Adaptive: a waiter drives the poller
  # for as long as the poller would spin
  pair "$run" "${t}_lat" async_adaptive "$size" \
    "$PERF ${t}_lat --api async --poll adaptive -d rxe0 -p 18600 -s $size -n $n" \
    "$PERF ${t}_lat --api async --poll adaptive -d rxe1 -p 18600 -s $size -n $n $IP0"
  [ -x "$BASE" ] && pair "$run" "${t}_lat" async_adaptive@base "$size" \
    "$BASE ${t}_lat --api async --poll adaptive -d rxe0 -p 18600 -s $size -n $n" \
    "$BASE ${t}_lat --api async --poll adaptive -d rxe1 -p 18600 -s $size -n $n $IP0"
  # the async API with its pollers on ordinary goroutines (docs/async.md)
  pair "$run" "${t}_lat" async_unlocked "$size" \
    "$PERF ${t}_lat --api async --poller_lock=false -d rxe0 -p 18600 -s $size -n $n" \
    "$PERF ${t}_lat --api async --poller_lock=false -d rxe1 -p 18600 -s $size -n $n $IP0"
  # the stream: a ping-pong of -s bytes on the net.Conn
  [ "$t" = send ] && pair "$run" "${t}_lat" stream "$size" \
    "$PERF send_lat --api stream -d rxe0 -p 18600 -s $size -n $n" \
    "$PERF send_lat --api stream -d rxe1 -p 18600 -s $size -n $n --out_json /tmp/last.json $IP0"
  [ "$t" = send ] && [ -x "$BASE" ] && pair "$run" "${t}_lat" stream@base "$size" \
    "$BASE send_lat --api stream -d rxe0 -p 18600 -s $size -n $n" \
    "$BASE send_lat --api stream -d rxe1 -p 18600 -s $size -n $n $IP0"
  return 0
}

# ud RUN: the UD points, perftest's -c UD beside rdmaperf's -c UD on
# both APIs (see the usage).
ud() {
  local run=$1 mtu
  want ud_send_bw || want ud_send_mr || want ud_send_lat || return 0
  mtu=$(for d in rxe0 rxe1; do ibv_devinfo -d "$d" | awk '$1 == "active_mtu:" {print $2}'; done | sort -n | head -1)
  local point test size n prog x
  for point in "ud_send_bw $mtu $N_UD" "ud_send_mr 2 $N_MR" "ud_send_lat 8 $N_LAT"; do
    read -r test size n <<< "$point"
    want "$test" || continue
    # MiB/s, not Gb/s: rdmaperf prints two decimals, and a TCG guest
    # moves a few MiB/s of 1 KiB datagrams
    prog=send_bw x=
    [ "$test" = ud_send_lat ] && prog=send_lat
    [ "$test" = ud_send_mr ] && x="-l 64 -Q 32"
    pair "$run" "$test" perftest "$size" \
      "ib_$prog -c UD -d rxe0 -x $GIDX -F -s $size -n $n $x" \
      "ib_$prog -c UD -d rxe1 -x $GIDX -F -s $size -n $n $x $IP0"
    for api in verbs async; do
      pair "$run" "$test" "$api" "$size" \
        "$PERF $prog -c UD --api $api -d rxe0 -p 18600 -s $size -n $n $x" \
        "$PERF $prog -c UD --api $api -d rxe1 -p 18600 -s $size -n $n $x $IP0"
    done
    # the PacketConn with Adaptive pollers, the library's default (see bw)
    pair "$run" "$test" async_adaptive "$size" \
      "$PERF $prog -c UD --api async --poll adaptive -d rxe0 -p 18600 -s $size -n $n $x" \
      "$PERF $prog -c UD --api async --poll adaptive -d rxe1 -p 18600 -s $size -n $n $x $IP0"
  done
}

# rs RUN: rsockets' own benchmark, rstream (rdmacm-utils), against the
# stream in the same session, same sizes: a 64 B ping-pong (rstream -C 1:
# its usec/xfer is half a round trip, as rdmaperf's t_avg) and 64 KiB
# transfers (rstream's Gb/sec, against the stream's send_bw). Prints
# "S RUN lat|bw stream|rstream SIZE VALUE" lines; compare.sh tabulates them.
rs() {
  local run=$1 i sp crc size n args
  local ip1=${RDMA_VM_IP1:?}
  for point in "lat 64 $N_LAT" "bw 65536 $N_BW"; do
    read -r kind size n <<< "$point"
    if [ "$kind" = lat ]; then args="-S $size -C 1 -I $n"; else args="-S $size -C $n -I 1"; fi
    timeout 120 rstream -b "$IP0" $args > /tmp/rs_server.out 2>&1 &
    sp=$! crc=1
    for ((i = 0; i < 60; i++)); do
      timeout 120 rstream -s "$IP0" -b "$ip1" $args > /tmp/rs_client.out 2>&1 && { crc=0; break; }
      kill -0 "$sp" 2>/dev/null || break
      sleep 0.25
    done
    wait "$sp"
    # name size xfers iters bytes seconds Gb/sec usec/xfer
    local row
    row=$(awk 'NF == 8 && $7 ~ /^[0-9.]+$/ {r = $0} END {print r}' /tmp/rs_client.out)
    if [ "$crc" != 0 ] || [ -z "$row" ]; then
      echo "FAIL rstream $kind $size"; tail -5 /tmp/rs_client.out /tmp/rs_server.out; fails=$((fails + 1))
    elif [ "$kind" = lat ]; then
      echo "S $run lat rstream $size $(echo "$row" | awk '{print $8}')"
    else
      # Gb/s from its seconds and the bytes both ways (its own Gb/sec
      # column has two decimals, too few at rxe's 0.1 Gb/s)
      echo "S $run bw rstream $size $(echo "$row" | awk -v b=$((size * n * 2)) '{s = $6; sub(/s$/, "", s); printf "%.4f", b * 8 / s / 1e9}')"
    fi
    local test=send_bw poll tool
    [ "$kind" = lat ] && test=send_lat
    # the stream with Busy pollers (rdmaperf's default), and with the
    # library's default, Adaptive (stream_adaptive)
    for poll in busy adaptive; do
      tool=stream
      [ "$poll" = adaptive ] && tool=stream_adaptive
      pair "$run" "rs_$test" "$tool" "$size" \
        "$PERF $test --api stream --poll $poll -d rxe0 -p 18600 -s $size -n $n $( [ "$kind" = bw ] && echo --report_gbits)" \
        "$PERF $test --api stream --poll $poll -d rxe1 -p 18600 -s $size -n $n $( [ "$kind" = bw ] && echo --report_gbits) $IP0" > /tmp/rs_pair.out
      cat /tmp/rs_pair.out | grep -v '^R ' || true
      # send_lat: t_avg (the 4th figure); send_bw: Gb/s from the
      # message rate (6 decimals; BW average has 2)
      awk -v run="$run" -v kind="$kind" -v size="$size" -v tool="$tool" '$1 == "R" {print "S", run, kind, tool, size, (kind == "lat" ? $9 : sprintf("%.4f", $8 * size * 8 / 1000))}' /tmp/rs_pair.out
    done
  done
}

echo "guest: $(nproc) CPUs, $(uname -r), $(ib_write_bw --version 2>&1 | head -1), clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
echo "params: runs=$RUNS n_bw=$N_BW n_lat=$N_LAT n_mr=$N_MR sizes=$BW_SIZES lat_sizes=$LAT_SIZES n_ud=$N_UD tests=$TESTS gid_index=$GIDX"
echo "load: $(cat /proc/loadavg)"
T0=$SECONDS
for ((r = 1; r <= RUNS; r++)); do
  # the floor under the raw verbs path's figures: one call into the
  # provider (cgo) and one empty poll inside it, on the client's device
  $PERF send_lat --floor -d rxe1 | awk -v run="$r" '$1 == "floor:" {print "F", run, $9, $16}'
  for s in $BW_SIZES; do
    n=$N_BW
    [ "$s" -ge 1048576 ] && n=$((N_BW / 10 > 10 ? N_BW / 10 : 10))
    want write_bw && bw "$r" write "$s" "$n"
    want send_bw && bw "$r" send "$s" "$n"
    want read_bw && bw "$r" read "$s" "$n"
  done
  # message rate: 2 B, post lists of 64, one completion per 32 WRs
  want write_mr && bw "$r" write 2 "$N_MR" -l 64 -Q 32
  for s in $LAT_SIZES; do want send_lat && lat "$r" send "$s" "$N_LAT"; done
  for s in $LAT_SIZES; do want write_lat && lat "$r" write "$s" "$N_LAT"; done
  want rstream && rs "$r"
  ud "$r"
  echo "run $r done at $((SECONDS - T0)) s, guest load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "failures: $fails"
[ "$fails" = 0 ]
