#!/bin/bash
# Compare rdmaperf with perftest on the same rxe devices, in ONE VM run
# (test/vm/run.sh): server on rxe0/10.99.0.1, client on rxe1/10.99.0.2, the
# tools back to back with the same parameters, RUNS rounds interleaved.
# Prints the ratio table (medians over the runs) and writes, under OUT:
#   raw.txt        every measurement (guest output)
#   compare.json   medians, ratios and targets
#   compare.png    chart: each tool's median against perftest's
#   table.md       the table as docs/performance.md shows it
#
# Usage: test/perf/compare.sh [-r RUNS] [-b N_BW] [-l N_LAT] [-m N_MR] [-s "SIZES"] [-T "TESTS"] [-o OUT]
#   -r RUNS   rounds; the table shows the median (default 5)
#   -b N_BW   iterations of the bandwidth tests (default 1000; 1 MiB uses N_BW/10)
#   -l N_LAT  iterations of the latency tests (default 3000)
#   -m N_MR   iterations of the 2 B message-rate test, a multiple of 64 (default 12800)
#   -s SIZES  write_bw sizes in bytes (default "65536"; send/read run at 64 KiB)
#   -T TESTS  which points (default all: write_bw send_bw read_bw write_mr
#             send_lat write_lat)
#   -o OUT    output directory (default test/perf/results)
# Env: TIMEOUT (VM wall-clock limit, default 600 s), anything test/vm/run.sh takes.
# Needs what test/vm/setup.sh installs (run as root once) and a Go toolchain.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RUNS=5 N_BW=1000 N_LAT=3000 N_MR=12800 SIZES=65536 OUT=$ROOT/test/perf/results
TESTS="write_bw send_bw read_bw write_mr send_lat write_lat"
while getopts ":r:b:l:m:s:T:o:h" opt; do
  case $opt in
    r) RUNS=$OPTARG ;;
    b) N_BW=$OPTARG ;;
    l) N_LAT=$OPTARG ;;
    m) N_MR=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    T) TESTS=$OPTARG ;;
    o) OUT=$OPTARG ;;
    *) sed -n '2,21s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
  esac
done
for v in "$RUNS" "$N_BW" "$N_LAT" "$N_MR"; do
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
echo "VM run: runs=$RUNS n_bw=$N_BW n_lat=$N_LAT n_mr=$N_MR sizes=$SIZES tests=$TESTS"
echo "host load: $(cat /proc/loadavg)"
set +e
TIMEOUT=${TIMEOUT:-600} "$ROOT/test/vm/run.sh" -f "$OUT/rdmaperf" "$ROOT/test/perf/guest.sh" \
  "$RUNS" "$N_BW" "$N_LAT" "$N_MR" "$SIZES" "$TESTS" | tee "$OUT/raw.txt"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || echo "compare.sh: the VM job failed (exit $rc); summarising what was measured" >&2
"$OUT/summarize" -json "$OUT/compare.json" -png "$OUT/compare.png" < "$OUT/raw.txt" | tee "$OUT/table.md"
rm -f "$OUT/rdmaperf" "$OUT/summarize"
exit "$rc"
