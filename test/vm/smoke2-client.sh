#!/bin/bash
# Guest-side client half of the two-VM smoke test (VM B, 10.99.1.2); see
# smoke2-server.sh.
set -uo pipefail
PEER=${RDMA_VM_PEER_IP:?not in a two-VM run?}
fails=0

# The VMs boot independently: wait (bounded) until the server VM answers.
for ((i = 0; i < 60; i++)); do
  ping -c1 -W1 "$PEER" > /dev/null 2>&1 && break
  sleep 0.5
done
echo "server $PEER: $( ((i < 60)) && echo reachable || echo NOT reachable)"

# retry CMD...: the server may not be listening yet; retry for up to ~60 s.
retry() {
  local i
  for ((i = 0; i < 120; i++)); do
    "$@" > /tmp/out 2>&1 && { cat /tmp/out; return 0; }
    sleep 0.5
  done
  cat /tmp/out
  return 1
}
# run NAME CMD...
run() {
  local name=$1
  shift
  echo "--- $name: $*"
  if retry "$@"; then echo "ok   $name"; else echo "FAIL $name (exit $?)"; fails=$((fails + 1)); fi
}

timeout 10 ibv_devices
run ib_send_bw timeout 60 ib_send_bw -d rxe0 -n 200 "$PEER"
run ibv_rc_pingpong timeout 60 ibv_rc_pingpong -d rxe0 -g "$RDMA_VM_GID_INDEX" -n 100 "$PEER"
run rping timeout 60 rping -c -a "$PEER" -C 3 -v
if [ "$fails" = 0 ]; then echo "SMOKE2 PASS"; else echo "SMOKE2 FAIL: $fails check(s) failed"; fi
exit "$fails"
