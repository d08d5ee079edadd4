#!/bin/bash
# Guest-side server half of the two-VM smoke test (VM A, 10.99.1.1):
#   test/vm/run2.sh test/vm/smoke2-server.sh test/vm/smoke2-client.sh
# Serves, one after the other: ib_send_bw (verbs), ibv_rc_pingpong (verbs),
# rping (rdma_cm). The client retries each until the server is listening.
set -uo pipefail
SELF=${RDMA_VM_SELF_IP:?not in a two-VM run?}
fails=0

# serve NAME CMD...
serve() {
  local name=$1
  shift
  echo "--- $name: $*"
  if "$@"; then echo "ok   $name"; else echo "FAIL $name (exit $?)"; fails=$((fails + 1)); fi
}

timeout 10 ibv_devices
serve ib_send_bw timeout 120 ib_send_bw -d rxe0 -n 200
serve ibv_rc_pingpong timeout 120 ibv_rc_pingpong -d rxe0 -g "$RDMA_VM_GID_INDEX" -n 100
serve rping timeout 120 rping -s -a "$SELF" -C 3 -v
exit "$fails"
