#!/bin/bash
# Profile perftest and rdmaperf side by side on the same rxe devices, in
# ONE VM run (test/vm/run.sh): each point runs once per tool under a
# system-wide `perf record` (cpu-clock), the client under `perf stat`.
# Writes OUT/profile.txt (default test/perf/results/profile).
#
# Usage: test/perf/profile.sh [-o OUT] [POINT...]
#   POINT: write_bw send_bw write_mr send_lat write_lat (default all),
#          ud_send_bw ud_send_lat (-c UD)
# Needs what test/vm/setup.sh installs, plus linux-perf (installed here).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$ROOT/test/perf/results/profile
if [ "${1:-}" = -o ]; then OUT=$2; shift 2; fi
command -v perf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q linux-perf >/dev/null
if pgrep qemu-system >/dev/null; then
  echo "profile.sh: a VM is running already (pgrep qemu-system); one at a time" >&2
  exit 1
fi
mkdir -p "$OUT"
(cd "$ROOT" && CGO_ENABLED=1 go build -o "$OUT/rdmaperf" ./cmd/rdmaperf)
echo "host load: $(cat /proc/loadavg)"
set +e
TIMEOUT=${TIMEOUT:-900} "$ROOT/test/vm/run.sh" -f "$OUT/rdmaperf" "$ROOT/test/perf/profile-guest.sh" "$*" | tee "$OUT/profile.txt"
rc=${PIPESTATUS[0]}
rm -f "$OUT/rdmaperf"
exit "$rc"
