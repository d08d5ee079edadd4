#!/bin/bash
# Guest-side smoke job for run.sh: test/vm/run.sh test/vm/smoke.sh
# Checks that rxe0/rxe1 exist and are ACTIVE, then runs perftest between them
# (server on rxe0 / 10.99.0.1, client on rxe1) over plain verbs and over
# rdma_cm, and an rping. Every command is bounded with timeout.
set -uo pipefail
IP0=${RDMA_VM_IP0:?not in the VM?}
fails=0

ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

tx_packets() { cat /sys/class/net/veth1/statistics/tx_packets; }

# pair NAME SERVER_CMD CLIENT_CMD: start the server in the background, retry
# the client until it succeeds (the server needs a moment to listen; under TCG
# that can be a second or more), give up after ~20 s or when the server died.
# Also checks that the traffic really crossed the veth pair (rxe1 -> rxe0),
# rather than being short-cut through lo or rxe0's internal loopback.
pair() {
  local name=$1 srv=$2 cli=$3 sp i crc=1 src tx0 sent
  echo "--- $name"
  tx0=$(tx_packets)
  bash -c "$srv" > /tmp/server.out 2>&1 &
  sp=$!
  for ((i = 0; i < 40; i++)); do
    bash -c "$cli" > /tmp/client.out 2>&1 && { crc=0; break; }
    kill -0 "$sp" 2>/dev/null || break
    sleep 0.5
  done
  wait "$sp"
  src=$?
  sent=$(( $(tx_packets) - tx0 ))
  cat /tmp/client.out
  echo "veth1 sent $sent packets"
  if [ "$crc" = 0 ] && [ "$src" = 0 ] && [ "$sent" -ge 10 ]; then
    ok "$name"
  else
    echo "server side (exit $src):"
    cat /tmp/server.out
    fail "$name (client exit $crc after $((i + 1)) tries, server exit $src, $sent packets on veth1)"
  fi
}

echo "--- devices"
devs=$(timeout 10 ibv_devices)
echo "$devs"
for d in rxe0 rxe1; do
  if grep -qw "$d" <<< "$devs"; then ok "ibv_devices lists $d"; else fail "ibv_devices lists $d"; fi
  if timeout 10 ibv_devinfo -d "$d" | grep -q 'state:.*PORT_ACTIVE'; then
    ok "$d port 1 ACTIVE"
  else
    fail "$d port 1 ACTIVE"
  fi
done
timeout 10 rdma link show

pair "ib_write_bw rxe0 <- rxe1 (verbs, TCP handshake)" \
  "timeout 60 ib_write_bw -d rxe0 -n 200" \
  "timeout 30 ib_write_bw -d rxe1 -n 200 $IP0"
pair "ib_write_bw -R rxe0 <- rxe1 (rdma_cm)" \
  "timeout 60 ib_write_bw -R -d rxe0 -n 200" \
  "timeout 30 ib_write_bw -R -d rxe1 -n 200 $IP0"
pair "rping -C 3 (rdma_cm)" \
  "timeout 60 rping -s -a $IP0 -C 3 -v" \
  "timeout 30 rping -c -a $IP0 -C 3 -v"

if [ "$fails" = 0 ]; then echo "SMOKE PASS"; else echo "SMOKE FAIL: $fails check(s) failed"; fi
exit "$fails"
