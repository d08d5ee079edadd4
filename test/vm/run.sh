#!/bin/bash
# Run a job script inside ONE throwaway VM with Soft-RoCE, print its output,
# exit with its exit code.
#
# Usage: test/vm/run.sh [-f FILE]... [-t TIMEOUT_S] JOB_SCRIPT [ARG]...
#        test/vm/run.sh [-f FILE]... [-t TIMEOUT_S] -c 'COMMANDS' [ARG]...
#   -f FILE   copy FILE (or a directory) into the job dir; repeatable.
#             The guest sees the job dir as /job, and the job runs there.
#   -t SECS   wall-clock limit for the whole VM run (default $TIMEOUT or 600)
#   -c CMDS   run CMDS (bash) instead of a script file
#   ARGs are passed to the job script as "$@".
#
# The guest boots the stock Debian kernel with the host's / as a read-only root
# (writes go to a tmpfs overlay), no network device at all (-nic none), and
# before the job starts:
#   rdma_rxe + rdma_ucm loaded, ulimit -l unlimited,
#   veth0 10.99.0.1/24 <-> veth1 10.99.0.2/24, rxe0 on veth0, rxe1 on veth1,
#   both ports ACTIVE with their RoCEv2 GIDs,
#   siw (soft-iWARP) loaded, veth2 10.99.2.1/24 <-> veth3 10.99.2.2/24,
#   siw0 on veth2, siw1 on veth3, both ACTIVE,
#   env RDMA_TEST_REQUIRE_DEVICE=1 RDMA_VM=1 RDMA_VM_IP0=10.99.0.1
#       RDMA_VM_IP1=10.99.0.2 RDMA_VM_GID_INDEX=<RoCEv2 GID index of rxe0>
#       RDMA_VM_SIW_IP0=10.99.2.1 RDMA_VM_SIW_IP1=10.99.2.2
#
# Exit code: the job's; 124 = timeout; 125 = the VM produced no result;
#            2 = usage error.
# Env: TIMEOUT (600) MEM (2048 MiB) SMP (2) ACCEL (tcg|kvm; default: probe KVM,
#      fall back to TCG) KEEP=1 (keep the job dir) KARGS (extra kernel args)
#      RDMA_VM_CACHE (see setup.sh)
set -euo pipefail
VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_PROG=run.sh
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$VM_DIR/common.sh"
: "${SMP:=2}"

usage() { sed -n '4,11s/^# \{0,1\}//p' "$0" >&2; exit 2; }

FILES=()
CMD=
HAVE_CMD=0
while getopts ":f:t:c:h" opt; do
  case $opt in
    f) FILES+=("$OPTARG") ;;
    t) TIMEOUT=$OPTARG ;;
    c) CMD=$OPTARG; HAVE_CMD=1 ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
if [ "$HAVE_CMD" = 0 ]; then
  [ $# -ge 1 ] || usage
  SCRIPT=$1
  shift
  [ -f "$SCRIPT" ] || { vm_log "no such job script: $SCRIPT"; exit 2; }
fi
for f in "${FILES[@]}"; do [ -e "$f" ] || { vm_log "no such file: $f"; exit 2; }; done
vm_check_uint TIMEOUT "$TIMEOUT"
vm_check_uint MEM "$MEM"
vm_check_uint SMP "$SMP"

T0=$(date +%s%N)
vm_setup
vm_pick_accel

vm_new_job go-rdma-vm
# shellcheck disable=SC2317  # invoked by trap
cleanup() {
  vm_kill_qemu "$VM_JOB"
  if [ "${KEEP:-0}" = 1 ]; then vm_log "job dir kept: $VM_JOB"; else rm -rf "$VM_JOB"; fi
}
trap cleanup EXIT
trap 'vm_log "interrupted"; exit 130' INT
trap 'vm_log "terminated"; exit 143' TERM HUP

if [ "$HAVE_CMD" = 1 ]; then
  printf '%s\n' "$CMD" > "$VM_JOB/.vm/job.sh"
else
  cp "$SCRIPT" "$VM_JOB/.vm/job.sh"
fi
{ printf 'args=('; [ $# -gt 0 ] && printf '%q ' "$@"; printf ')\n'; } > "$VM_JOB/.vm/args"
printf 'VM_NET=veth\nVM_IP0=10.99.0.1\nVM_IP1=10.99.0.2\nVM_SIW_IP0=10.99.2.1\nVM_SIW_IP1=10.99.2.2\n' > "$VM_JOB/.vm/config"
vm_add_files "$VM_JOB" "${FILES[@]}"

# Run qemu in the background and wait for it: bash runs traps (Ctrl-C, TERM
# from a CI runner) only between commands, and `wait` is interruptible.
vm_run "$VM_JOB" "" -smp "$SMP" -nic none &
QRC=0
wait $! || QRC=$?
RC=$(vm_result "$VM_JOB" "$QRC" "")
vm_log "exit code $RC, wall $(vm_elapsed "$T0")s, accel $VM_ACCEL, kernel $VM_KVER"
exit "$RC"
