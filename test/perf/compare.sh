#!/bin/bash
# Compare rdmaperf with perftest on the same rxe devices, in ONE VM run
# (test/vm/run.sh): server on rxe0/10.99.0.1, client on rxe1/10.99.0.2, the
# tools back to back with the same parameters, RUNS rounds interleaved.
# Tools: perftest, rdmaperf --api verbs, --api async (latency also with
# --poller_lock=false: async_unlocked; bandwidth also with --poll adaptive,
# the library's default: async_adaptive), and --api stream for send_bw and
# send_lat (the net.Conn stream; its target is 0.8x the async API's send_bw
# at 64 KiB).
# Prints the ratio table (medians over the runs) and writes, under OUT:
#   raw.txt        every measurement (guest output)
#   compare.json   medians, ratios and targets
#   compare.png    chart against message size (log2 x, log y): left the BW
#                  average of each tool (write/send/read_bw), right the
#                  latency t_typical (send/write_lat); colour = tool, line
#                  and marker = operation. One size gives points.
#   ratios.png     bars: each tool's median divided by perftest's, with the
#                  targets as red marks
#   table.md       the full table, which docs/performance.md sums up
#
# Usage: test/perf/compare.sh [-r RUNS] [-b N_BW] [-l N_LAT] [-m N_MR] [-u N_UD] [-s "SIZES"] [-L "LAT_SIZES"] [-T "TESTS"] [-B BASE] [-P] [-o OUT]
#   -r RUNS   rounds; the table shows the median (default 5)
#   -b N_BW   iterations of the bandwidth tests (default 1000; 1 MiB and up use N_BW/10)
#   -l N_LAT  iterations of the latency tests (default 3000)
#   -m N_MR   iterations of the 2 B message-rate test, a multiple of 64 (default 12800)
#   -u N_UD   iterations of ud_send_bw (default 10000)
#   -s SIZES  write_bw, send_bw and read_bw sizes in bytes (default "65536";
#             e.g. "4096 65536 1048576" for bandwidth against size)
#   -L LAT_SIZES  send_lat and write_lat sizes in bytes (default "8"; e.g.
#             "8 64 1024 4096"). The targets are at 64 KiB (bandwidth), 2 B
#             (message rate) and 8 B (latency); other sizes get ratios only.
#   -T TESTS  which points (default all: write_bw send_bw read_bw write_mr
#             send_lat write_lat); "rstream" adds rsockets' own benchmark
#             (rdmacm-utils' rstream) beside the stream, a 64 B ping-pong
#             and 64 KiB transfers, with the ratios in a table of its own.
#             Not in the default either (about a minute more per run under
#             TCG): the UD points, perftest's -c UD beside rdmaperf -c UD
#             --api verbs and async: "ud_send_bw" (N_UD datagrams of the
#             path MTU, the smaller active MTU of rxe0 and rxe1: 1024 B, as
#             the veths' MTU is 1500; perftest's UD sizes stop at the MTU
#             too), "ud_send_mr" (2 B, post lists of 64, N_MR) and
#             "ud_send_lat" (8 B, N_LAT). Their send_bw figures are the
#             receivers'; a table says how many datagrams rdmaperf's
#             receivers missed
#   -B BASE   also run the async API and the stream of rdmaperf built at the
#             revision BASE (tools async@base, stream@base), interleaved
#             with the work tree's in the same VM: an A/B of the two trees
#             against the same perftest (scripts/bench-ab.sh -V runs this)
#   -P        also run the verbs and async APIs of rdmaperf built with
#             CGO_ENABLED=0 (tools verbs@purego, async@purego: the purego
#             binding of internal/ibv), interleaved with the cgo build's
#   -o OUT    output directory (default test/perf/results)
# Env: TIMEOUT (VM wall-clock limit, default 600 s), anything test/vm/run.sh takes.
# Needs what test/vm/setup.sh installs (run as root once) and a Go toolchain;
# the charts are drawn by test/perf/summarize (Go standard library only).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RUNS=5 N_BW=1000 N_LAT=3000 N_MR=12800 N_UD=10000 SIZES=65536 LAT_SIZES=8 OUT=$ROOT/test/perf/results BASE= PUREGO=0
TESTS="write_bw send_bw read_bw write_mr send_lat write_lat"
while getopts ":r:b:l:m:u:s:L:T:B:Po:h" opt; do
  case $opt in
    r) RUNS=$OPTARG ;;
    b) N_BW=$OPTARG ;;
    l) N_LAT=$OPTARG ;;
    m) N_MR=$OPTARG ;;
    u) N_UD=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    L) LAT_SIZES=$OPTARG ;;
    T) TESTS=$OPTARG ;;
    B) BASE=$OPTARG ;;
    P) PUREGO=1 ;;
    o) OUT=$OPTARG ;;
    *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
  esac
done
[ "$OPTIND" -gt $# ] || { echo "compare.sh: unexpected argument: ${!OPTIND} (-h for usage)" >&2; exit 2; }
if [ -z "${SIZES// /}" ] || [ -z "${LAT_SIZES// /}" ]; then
  echo "compare.sh: -s and -L want at least one size" >&2
  exit 2
fi
# shellcheck disable=SC2086 # the size lists are word lists
for v in "$RUNS" "$N_BW" "$N_LAT" "$N_MR" "$N_UD" $SIZES $LAT_SIZES; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: not a positive number: $v" >&2; exit 2; }
done
(( N_MR % 64 == 0 )) || { echo "compare.sh: -m must be a multiple of 64 (perftest's post list)" >&2; exit 2; }
if pgrep qemu-system >/dev/null; then
  echo "compare.sh: a VM is running already (pgrep qemu-system); one at a time" >&2
  exit 1
fi
mkdir -p "$OUT"
echo "building rdmaperf (cgo, for libibverbs)"
(cd "$ROOT" && CGO_ENABLED=1 go build -o "$OUT/rdmaperf" ./cmd/rdmaperf)
(cd "$ROOT" && go build -o "$OUT/summarize" ./test/perf/summarize)
files=(-f "$OUT/rdmaperf")
if [ "$PUREGO" = 1 ]; then
  echo "building rdmaperf (CGO_ENABLED=0: the purego binding)"
  (cd "$ROOT" && CGO_ENABLED=0 go build -o "$OUT/rdmaperf.purego" ./cmd/rdmaperf)
  files+=(-f "$OUT/rdmaperf.purego")
fi
if [ -n "$BASE" ]; then
  echo "building rdmaperf at $BASE"
  "$ROOT/test/perf/rdmaperf-at.sh" "$BASE" "$OUT/rdmaperf.base"
  files+=(-f "$OUT/rdmaperf.base")
fi
echo "VM run: runs=$RUNS n_bw=$N_BW n_lat=$N_LAT n_mr=$N_MR n_ud=$N_UD sizes=$SIZES lat_sizes=$LAT_SIZES tests=$TESTS"
echo "host load: $(cat /proc/loadavg)"
set +e
TIMEOUT=${TIMEOUT:-600} "$ROOT/test/vm/run.sh" "${files[@]}" "$ROOT/test/perf/guest.sh" \
  "$RUNS" "$N_BW" "$N_LAT" "$N_MR" "$SIZES" "$TESTS" "$LAT_SIZES" "$N_UD" | tee "$OUT/raw.txt"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || echo "compare.sh: the VM job failed (exit $rc); summarising what was measured" >&2
# (-T rstream alone has no R lines, only S lines, below)
: > "$OUT/table.md"
grep -q '^R ' "$OUT/raw.txt" && "$OUT/summarize" -json "$OUT/compare.json" -png "$OUT/compare.png" -ratios "$OUT/ratios.png" \
  < "$OUT/raw.txt" | tee "$OUT/table.md"
# The stream against rsockets (-T rstream): medians of the S lines.
if grep -q '^S ' "$OUT/raw.txt"; then
  awk '$1 == "S" {v[$3" "$4" "$5] = v[$3" "$4" "$5] " " $6}
    function median(s,   a, n, i, j, t) {
      n = split(s, a, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END {
      print "\n| point | size | poll mode | stream | rstream | stream/rstream | target |\n|---|---|---|---|---|---|---|"
      for (k in v) { split(k, f, " "); if (f[2] == "stream" || f[2] == "stream_adaptive") { o = f[1] " rstream " f[3]
        if (!(o in v)) continue
        s = median(v[k]); r = median(v[o]); m = f[2] == "stream" ? "Busy" : "Adaptive"
        if (f[1] == "lat") printf "| round trip / 2, t_avg [usec] | %d B | %s | %.1f | %.1f | %.2f× | ≤1.50× |\n", f[3], m, s, r, s / r
        else printf "| bandwidth [Gb/s] | %d B | %s | %.3f | %.3f | %.2f× | ≥1.00× |\n", f[3], m, s, r, s / r } }
    }' "$OUT/raw.txt" | tee -a "$OUT/table.md"
fi
# Datagrams rdmaperf's receivers missed over UD: the U lines, summed
# over the runs.
if grep -q '^U ' "$OUT/raw.txt"; then
  awk '$1 == "U" {k = $3 " | " $4 " | " $5; s[k] += $6; r[k] += $7; n[k]++}
    END {
      print "\n| UD point | rdmaperf | size | datagrams sent | received | dropped at the receiver |\n|---|---|---|---|---|---|"
      for (k in s) printf "| %s | %d | %d | %d (%.2f%%) |\n", k, s[k], r[k], s[k] - r[k], 100 * (s[k] - r[k]) / s[k]
    }' "$OUT/raw.txt" | tee -a "$OUT/table.md"
fi
# The floor under the raw verbs path (rdmaperf --floor): medians of the F
# lines.
if grep -q '^F ' "$OUT/raw.txt"; then
  awk '$1 == "F" {c[++n] = $3; p[n] = $4}
    function median(a, n,   i, j, t) {
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END { printf "\nFloor (rdmaperf --floor, medians of %d runs): a call into the provider %.3f usec, an empty poll inside one %.3f usec\n", n, median(c, n), median(p, n) }' "$OUT/raw.txt" | tee -a "$OUT/table.md"
fi
rm -f "$OUT/rdmaperf" "$OUT/rdmaperf.base" "$OUT/rdmaperf.purego" "$OUT/summarize"
exit "$rc"
