#!/bin/bash
# Bulk transfers between two processes on loopback, side by side: a TCP
# io.Copy (test/perf/bulk), rdmacat and the datamover example, both on the
# soft provider, on the same file. Each round runs every transfer once,
# interleaved; the table has the median seconds of each and its ratio to
# TCP (TCP's time over its own: 1.00 is as fast as TCP, 0.50 half as fast).
# The received bytes are compared with the file (cmp).
#
# Usage: test/perf/bulk.sh [-n MiB] [-r ROUNDS] [-o DIR] [-p] [-x "ARGS"] [-y "ARGS"] [KIND...]
#   -n MiB    size of the file (default 256)
#   -r N      rounds (default 5)
#   -o DIR    keep the binaries, logs and profiles in DIR (default: a temp dir, removed)
#   -p        CPU profiles of both processes of every transfer in DIR/pprof
#             (rdmacat and datamover -cpuprofile); read them with go tool pprof
#   -x ARGS   extra flags for rdmacat (both ends), e.g. "-ring 4194304"
#   -y ARGS   extra flags for datamover (both ends), e.g. "-j 8 -chunk 4MiB"
#   KIND      tcp, rdmacat, datamover, datamover-crc32c (datamover -sum crc32c:
#             a CRC-32C instead of SHA-256 at both ends) (default all four)
# Exits 1 when a transfer fails or delivers other bytes, 2 on bad usage;
# a ratio below the target does not fail it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MIB=256
ROUNDS=5
DIR=
PROF=
XCAT=
XDM=
usage() { sed -n '2,/^set -e/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
while getopts "n:r:o:px:y:h" opt; do
  case $opt in
  n) MIB=$OPTARG ;;
  r) ROUNDS=$OPTARG ;;
  o) DIR=$OPTARG ;;
  p) PROF=1 ;;
  x) XCAT=$OPTARG ;;
  y) XDM=$OPTARG ;;
  *) usage ;;
  esac
done
shift $((OPTIND - 1))
KINDS=("$@")
[ ${#KINDS[@]} -gt 0 ] || KINDS=(tcp rdmacat datamover datamover-crc32c)
for k in "${KINDS[@]}"; do
  case $k in tcp | rdmacat | datamover | datamover-crc32c) ;; *) echo "bulk.sh: unknown kind $k" >&2; usage ;; esac
done
case $MIB$ROUNDS in *[!0-9]*) usage ;; esac
[ "$MIB" -gt 0 ] && [ "$ROUNDS" -gt 0 ] || usage

if [ -z "$DIR" ]; then
  DIR=$(mktemp -d)
  trap 'rm -rf "$DIR"' EXIT
fi
mkdir -p "$DIR/bin" "$DIR/log"
[ -z "$PROF" ] || mkdir -p "$DIR/pprof"
(cd "$ROOT" && go build -o "$DIR/bin/" ./cmd/rdmacat ./cmd/examples/datamover ./test/perf/bulk)

IN=$DIR/in.bin
OUT=$DIR/out.bin
# Random data, so that nothing along the way gets it cheaper.
head -c $((MIB << 20)) /dev/urandom >"$IN"

now() { date +%s%N; }

# cpusum FILE...: the user and system seconds of the children in the
# output of bash's times (its second line), summed per file. times must
# run in the shell that waited for the children, not in a $(...).
cpusum() { awk 'FNR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } print s }' "$@"; }

# listener LOG PATTERN: wait until LOG has a line matching PATTERN (the
# listener's "listening on ADDR") and print ADDR.
listener() {
  local log=$1 pid=$2 i line
  for ((i = 0; i < 2000; i++)); do
    line=$(grep -m1 -o 'listening on [^ ]*' "$log" 2>/dev/null || true)
    if [ -n "$line" ]; then
      echo "${line#listening on }"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  echo "bulk.sh: the listener did not start:" >&2
  cat "$log" >&2
  return 1
}

# transfer KIND ROUND: one transfer; prints its seconds and the CPU
# seconds of both processes.
transfer() {
  local kind=$1 round=$2 rlog=$DIR/log/$1.$2.recv slog=$DIR/log/$1.$2.send
  local rprof=() sprof=() xdm=$XDM rpid addr t0 t1 c0 c1 rc=0
  rm -f "$OUT"
  if [ -n "$PROF" ] && [ "$kind" != tcp ]; then
    rprof=(-cpuprofile "$DIR/pprof/$kind.$round.recv")
    sprof=(-cpuprofile "$DIR/pprof/$kind.$round.send")
  fi
  if [ "$kind" = datamover-crc32c ]; then
    kind=datamover xdm="-sum crc32c $XDM"
  fi
  case $kind in
  tcp)
    "$DIR/bin/bulk" -l 127.0.0.1:0 -o "$OUT" 2>"$rlog" &
    ;;
  rdmacat)
    # shellcheck disable=SC2086
    "$DIR/bin/rdmacat" -provider soft -l -d -v "${rprof[@]}" $XCAT 127.0.0.1:0 </dev/null >"$OUT" 2>"$rlog" &
    ;;
  datamover)
    # shellcheck disable=SC2086
    "$DIR/bin/datamover" -provider soft -q -l 127.0.0.1:0 -o "$OUT" "${rprof[@]}" $xdm >"$rlog" 2>&1 &
    ;;
  esac
  rpid=$!
  addr=$(listener "$rlog" "$rpid") || { wait "$rpid" || true; return 1; }
  times >"$DIR/times.0"
  t0=$(now)
  case $kind in
  tcp) "$DIR/bin/bulk" -c "$addr" -i "$IN" >"$slog" 2>&1 || rc=$? ;;
  # shellcheck disable=SC2086
  rdmacat) "$DIR/bin/rdmacat" -provider soft "${sprof[@]}" $XCAT "$addr" <"$IN" >"$slog" 2>&1 || rc=$? ;;
  # shellcheck disable=SC2086
  datamover) "$DIR/bin/datamover" -provider soft -q -addr "$addr" -i "$IN" "${sprof[@]}" $xdm >"$slog" 2>&1 || rc=$? ;;
  esac
  wait "$rpid" || rc=$((rc == 0 ? $? : rc))
  t1=$(now)
  times >"$DIR/times.1"
  { read -r c0; read -r c1; } < <(cpusum "$DIR/times.0" "$DIR/times.1")
  if [ "$rc" -ne 0 ]; then
    echo "bulk.sh: $kind (round $round) failed, exit $rc" >&2
    tail -n 5 "$slog" "$rlog" >&2
    return 1
  fi
  if ! cmp -s "$IN" "$OUT"; then
    echo "bulk.sh: $kind (round $round) delivered other bytes than it was given" >&2
    return 1
  fi
  awk -v a="$t0" -v b="$t1" -v c="$c0" -v d="$c1" 'BEGIN { printf "%.3f %.3f\n", (b - a) / 1e9, d - c }'
}

echo "bulk.sh: $MIB MiB, $ROUNDS rounds, $(go env GOVERSION), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A TIMES CPUS
failed=0
for ((r = 1; r <= ROUNDS; r++)); do
  line="round $r:"
  for k in "${KINDS[@]}"; do
    if out=$(transfer "$k" "$r"); then
      read -r s c <<<"$out"
      TIMES[$k]="${TIMES[$k]:-} $s"
      CPUS[$k]="${CPUS[$k]:-} $c"
      line="$line $k ${s}s (cpu ${c}s)"
    else
      failed=1
      line="$line $k FAILED"
    fi
  done
  echo "$line"
done

median() { tr ' ' '\n' | awk 'NF' | sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
tcp=$(echo "${TIMES[tcp]:-}" | median)
echo
echo "| transfer ($MIB MiB) | median s | MB/s | ratio to TCP | CPU s, both processes |"
echo "|---|---|---|---|---|"
for k in "${KINDS[@]}"; do
  m=$(echo "${TIMES[$k]:-}" | median)
  c=$(echo "${CPUS[$k]:-}" | median)
  awk -v k="$k" -v m="$m" -v t="$tcp" -v mib="$MIB" -v c="$c" 'BEGIN {
    mbs = (m == "-" || m == 0) ? "-" : sprintf("%.0f", mib * 1048576 / m / 1e6)
    ratio = (m == "-" || t == "-" || m == 0) ? "-" : sprintf("%.2fx", t / m)
    printf "| %s | %s | %s | %s | %s |\n", k, m, mbs, ratio, c }'
done
exit "$failed"
