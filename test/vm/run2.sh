#!/bin/bash
# Run a server job and a client job in TWO VMs joined by a private link, print
# both outputs (lines prefixed "[server] " / "[client] "), fail if either fails.
#
# Usage: test/vm/run2.sh [-f FILE]... [-t TIMEOUT_S] SERVER_SCRIPT CLIENT_SCRIPT
#   -f FILE   copy FILE (or a directory) into both job dirs (guest: /job/NAME)
#   -t SECS   wall-clock limit per VM (default $TIMEOUT or 600)
#
# The link is a qemu "socket" netdev over UDP on 127.0.0.1 (host loopback
# only; TCP would add ~22 ms Nagle stalls), one virtio NIC per VM, nothing
# else. Before its job starts, each guest has (as in run.sh: rdma_rxe,
# rdma_ucm, ulimit -l unlimited):
#   VM A (server): eth0 10.99.1.1/24, rxe0 on eth0
#   VM B (client): eth0 10.99.1.2/24, rxe0 on eth0
#   the peer answering ping (waited for, bounded), and
#   env RDMA_TEST_REQUIRE_DEVICE=1 RDMA_VM=1 RDMA_VM_ROLE=server|client
#       RDMA_VM_SELF_IP RDMA_VM_PEER_IP RDMA_VM_GID_INDEX
# The client must still wait for the server's service itself (e.g. retry the
# connection), since the two jobs start independently.
#
# Exit code: 0 if both jobs passed; else the client's code if it failed, else
#            the server's (124 = timeout, 125 = no result, as in run.sh).
# Env: TIMEOUT (600) MEM (2048 MiB per VM) SMP (1 per VM) ACCEL KEEP KARGS
#      RDMA_VM_CACHE (see run.sh)
set -euo pipefail
VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_PROG=run2.sh
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$VM_DIR/common.sh"
: "${SMP:=1}"

usage() { sed -n '5,7s/^# \{0,1\}//p' "$0" >&2; exit 2; }

FILES=()
while getopts ":f:t:h" opt; do
  case $opt in
    f) FILES+=("$OPTARG") ;;
    t) TIMEOUT=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# = 2 ] || usage
for s in "$1" "$2"; do [ -f "$s" ] || { vm_log "no such job script: $s"; exit 2; }; done
for f in "${FILES[@]}"; do [ -e "$f" ] || { vm_log "no such file: $f"; exit 2; }; done
vm_check_uint TIMEOUT "$TIMEOUT"
vm_check_uint MEM "$MEM"
vm_check_uint SMP "$SMP"

# free_udp_port: a random port nobody on the host has bound (UDP).
free_udp_port() {
  local p i
  for ((i = 0; i < 50; i++)); do
    p=$((20000 + RANDOM % 40000))
    [ "$p" != "${1:-}" ] || continue
    [ -z "$(ss -Hlun "sport = :$p" 2>/dev/null)" ] && { echo "$p"; return 0; }
  done
  vm_log "no free UDP port found"
  exit 125
}

T0=$(date +%s%N)
vm_setup
vm_pick_accel

SCRIPTS=("$1" "$2")
ROLES=(server client)
IPS=(10.99.1.1 10.99.1.2)
MACS=(52:54:00:99:01:01 52:54:00:99:01:02)
PORT_A=$(free_udp_port)
PORT_B=$(free_udp_port "$PORT_A")
PORTS=("$PORT_A" "$PORT_B")
JOBS=()
# shellcheck disable=SC2317  # invoked by trap
cleanup() {
  local j
  for j in "${JOBS[@]}"; do vm_kill_qemu "$j"; done
  if [ "${KEEP:-0}" = 1 ]; then
    vm_log "job dirs kept: ${JOBS[*]}"
  else
    for j in "${JOBS[@]}"; do rm -rf "$j"; done
  fi
}
trap cleanup EXIT
trap 'vm_log "interrupted"; exit 130' INT
trap 'vm_log "terminated"; exit 143' TERM HUP

for i in 0 1; do
  vm_new_job "go-rdma-vm-${ROLES[i]}"
  JOBS+=("$VM_JOB")
  cp "${SCRIPTS[i]}" "$VM_JOB/.vm/job.sh"
  echo 'args=()' > "$VM_JOB/.vm/args"
  printf 'VM_NET=eth\nVM_ROLE=%s\nVM_SELF_IP=%s\nVM_PEER_IP=%s\n' \
    "${ROLES[i]}" "${IPS[i]}" "${IPS[1 - i]}" > "$VM_JOB/.vm/config"
  vm_add_files "$VM_JOB" "${FILES[@]}"
done
vm_log "link: udp 127.0.0.1:${PORTS[0]} <-> 127.0.0.1:${PORTS[1]}"

# Each VM sends to the other's port and listens on its own.
PIDS=()
for i in 0 1; do
  vm_run "${JOBS[i]}" "[${ROLES[i]}] " -smp "$SMP" \
    -netdev "socket,id=n0,udp=127.0.0.1:${PORTS[1 - i]},localaddr=127.0.0.1:${PORTS[i]}" \
    -device "virtio-net-pci,netdev=n0,mac=${MACS[i]},romfile=" &
  PIDS+=($!)
done
QRC=(0 0)
for i in 0 1; do wait "${PIDS[i]}" || QRC[i]=$?; done

RC=()
for i in 0 1; do RC[i]=$(vm_result "${JOBS[i]}" "${QRC[i]}" "${ROLES[i]}: "); done
vm_log "server exit code ${RC[0]}, client exit code ${RC[1]}, wall $(vm_elapsed "$T0")s, accel $VM_ACCEL"
if [ "${RC[1]}" != 0 ]; then exit "${RC[1]}"; fi
exit "${RC[0]}"
