#!/bin/bash
# Guest job: cmd/examples/http3's tests on rxe (HTTP/3 over rdma.PacketConn).
# Usage (inside the VM, cwd = job dir): http3tests.sh REPO BINARY
#   REPO     as for gotests.sh (beside this script), which runs BINARY
#   BINARY   the example's test binary (go test -c in cmd/examples/http3)
# QUIC needs datagrams of 1200 bytes. rxe's path MTU follows its netdev's
# MTU (NETDEV_CHANGEMTU), and the veths' 1500 gives it 1024: so first
# TestVerbsHTTP3SmallMTU at 1500 (the example refuses, saying why), then
# TestVerbsHTTP3 with both veths at 9000 (path MTU 4096), then the veths go
# back to 1500, whatever failed, so that later jobs see what they saw
# before. Prints HTTP3-SUMMARY: passed=N (test.sh wants 2); gotests.sh's
# own summaries are renamed, so that test.sh's VM-SUMMARY counts stay
# those of its other runs. Exits non-zero if a run or an MTU change failed.
set -u
repo=$1 bin=$2
here=$(dirname "$0")
rc=0

# mtu NETDEV_MTU PATH_MTU: set both veths' MTU and wait (bounded, ~10 s)
# until both rxe ports report the path MTU; rxe changes it in the netdev
# notifier, so it is usually there at once.
mtu() {
  local i d m ok
  ip link set veth0 mtu "$1" && ip link set veth1 mtu "$1" || return 1
  for ((i = 0; i < 100; i++)); do
    ok=1
    for d in rxe0 rxe1; do
      m=$(ibv_devinfo -d "$d" | sed -n 's/.*active_mtu:[[:space:]]*\([0-9]*\).*/\1/p')
      [ "$m" = "$2" ] || ok=0
    done
    [ "$ok" = 1 ] && { echo "=== veth0, veth1 at MTU $1: rxe0, rxe1 active_mtu $2"; return 0; }
    sleep 0.1
  done
  echo "=== veth MTU $1: rxe active_mtu is $m, want $2"
  return 1
}

# run RUN: the binary's tests matching RUN, through gotests.sh.
run() {
  bash "$here/gotests.sh" "$repo" "cmd/examples/http3=$bin@$1" 2>&1 | sed 's/^VM-SUMMARY:/gotests.sh (http3):/' | tee -a /tmp/http3.log
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
}

: > /tmp/http3.log
mtu 1500 1024 || rc=1
run '^TestVerbsHTTP3SmallMTU$'
if mtu 9000 4096; then
  run '^TestVerbsHTTP3$'
else
  rc=1
fi
mtu 1500 1024 || rc=1
echo "HTTP3-SUMMARY: passed=$(grep -cE -- '--- PASS: TestVerbsHTTP3' /tmp/http3.log)"
exit $rc
