#!/bin/bash
# Profile perftest and rdmaperf side by side on the same rxe devices, in
# ONE VM run (test/vm/run.sh): each point runs once per tool under a
# system-wide `perf record` (cpu-clock), the client under `perf stat`.
# Writes OUT/profile.txt (default test/perf/results/profile).
#
# Usage: test/perf/profile.sh [-o OUT] [-m N_MR] [POINT...]
#   POINT: write_bw send_bw write_mr send_lat write_lat (default all),
#          ud_send_bw ud_send_lat (-c UD), stream_bw (rstream, the
#          stream and the async API's send_bw at 64 KiB)
#   -m N_MR  iterations of write_mr (default 1280; under TCG that is
#            under a second: take 12800 for a profile of the rate)
# Needs what test/vm/setup.sh installs, plus linux-perf (installed here).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$ROOT/test/perf/results/profile
N_MR=1280
while [ "${1:-}" = -o ] || [ "${1:-}" = -m ]; do
  case $1 in
    -o) OUT=$2 ;;
    -m) N_MR=$2 ;;
  esac
  shift 2
done
command -v perf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q linux-perf >/dev/null
if pgrep qemu-system >/dev/null; then
  echo "profile.sh: a VM is running already (pgrep qemu-system); one at a time" >&2
  exit 1
fi
mkdir -p "$OUT"
(cd "$ROOT" && CGO_ENABLED=1 go build -o "$OUT/rdmaperf" ./cmd/rdmaperf)
echo "host load: $(cat /proc/loadavg)"
set +e
TIMEOUT=${TIMEOUT:-900} "$ROOT/test/vm/run.sh" -f "$OUT/rdmaperf" "$ROOT/test/perf/profile-guest.sh" "$*" "$N_MR" | tee "$OUT/profile.txt"
rc=${PIPESTATUS[0]}
rm -f "$OUT/rdmaperf"
exit "$rc"
