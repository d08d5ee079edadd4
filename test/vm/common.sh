# shellcheck shell=bash
# Host-side helpers shared by run.sh and run2.sh (sourced, not executed).
# Expects VM_DIR (this directory) to be set by the caller.

# Defaults; all overridable from the environment.
: "${MEM:=2048}"      # MiB per VM
: "${TIMEOUT:=600}"   # seconds per qemu run, wall clock
: "${ACCEL:=}"        # tcg | kvm | empty = probe KVM, fall back to TCG
: "${KVM_PROBE_TIMEOUT:=5}"  # seconds; a working KVM reaches stage 1 in ~1 s

vm_log() { echo "${VM_PROG:-rdma-vm}: $*" >&2; }

vm_check_uint() { # NAME VALUE
  [[ $2 =~ ^[1-9][0-9]*$ ]] || { vm_log "$1 must be a positive integer, got '$2'"; exit 2; }
}

# vm_setup: run setup.sh (installs/caches what is missing, prints progress to
# stderr) and import VM_KVER, VM_KERNEL, VM_INITRD, VM_MODDIR.
vm_setup() {
  local env
  env=$("$VM_DIR/setup.sh" --env) || { vm_log "setup.sh failed"; exit 125; }
  eval "$env"
}

# Common qemu arguments. The guest gets exactly three 9p shares (host / read-only,
# the kernel's modules read-only, the job dir read-write) and a serial console.
vm_qemu_base_args() { # JOBDIR -> VM_QEMU_ARGS
  local job=$1
  VM_QEMU_ARGS=(
    -nodefaults -no-user-config -display none -no-reboot
    -serial stdio -monitor none
    -m "$MEM"
    -kernel "$VM_KERNEL" -initrd "$VM_INITRD"
    # no_timer_check: under TCG the IO-APIC timer check can misfire and print
    # a scary "MP-BIOS bug" line into the job output
    -append "console=ttyS0 quiet loglevel=4 panic=-1 no_timer_check ${KARGS:-}"
    # multidevs=remap: / spans several host filesystems; keeps inode numbers unique
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=$VM_MODDIR,mount_tag=kmod,security_model=none,readonly=on"
    -virtfs "local,path=$job,mount_tag=job,security_model=none"
    -pidfile "$job/.vm/qemu.pid"
  )
}

# vm_pick_accel: decide once per invocation; sets VM_ACCEL and VM_ACCEL_ARGS.
# /dev/kvm may exist and still be useless (e.g. a PVM host: "-cpu host" aborts
# with "failed to set MSR 0x10a", other CPU models hang in early boot), so KVM
# is only used after a short bounded boot of the real kernel + initramfs
# reached stage 1 and printed a marker.
vm_pick_accel() {
  local why out
  case "$ACCEL" in
    tcg) VM_ACCEL=tcg; why="forced by ACCEL=tcg" ;;
    kvm) VM_ACCEL=kvm; why="forced by ACCEL=kvm" ;;
    "")
      VM_ACCEL=tcg
      if ! [ -r /dev/kvm ] || ! [ -w /dev/kvm ]; then
        why="/dev/kvm not usable"
      else
        local rc=0 ms t0
        t0=$(date +%s%N)
        out=$(timeout -k 2 "$KVM_PROBE_TIMEOUT" qemu-system-x86_64 -accel kvm -cpu host \
          -m 256 -smp 1 -nodefaults -no-user-config -display none -no-reboot \
          -serial stdio -monitor none -kernel "$VM_KERNEL" -initrd "$VM_INITRD" \
          -append "console=ttyS0 quiet panic=-1 rdmavm.probe" < /dev/null 2>&1) || rc=$?
        ms=$(( ($(date +%s%N) - t0) / 1000000 ))
        if grep -q RDMAVM-PROBE-OK <<< "$out"; then
          VM_ACCEL=kvm; why="KVM probe booted in ${ms} ms"
        elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
          why="KVM probe hung (no boot within ${KVM_PROBE_TIMEOUT}s)"
        else
          why="KVM probe failed in ${ms} ms: $(tr -d '\r' <<< "$out" | grep -v '^\s*$' | tail -n1)"
        fi
      fi ;;
    *) vm_log "ACCEL must be tcg or kvm, got '$ACCEL'"; exit 2 ;;
  esac
  if [ "$VM_ACCEL" = kvm ]; then
    VM_ACCEL_ARGS=(-accel kvm -cpu host)
  else
    # "max" = every feature TCG can emulate, so host-built binaries that use
    # e.g. SSE4/AVX2 still run.
    VM_ACCEL_ARGS=(-accel tcg -cpu max)
  fi
  vm_log "accel: $VM_ACCEL ($why)"
}

# vm_new_job PREFIX -> VM_JOB: fresh job dir with stage 2 inside.
vm_new_job() {
  VM_JOB=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  chmod 755 "$VM_JOB"
  mkdir "$VM_JOB/.vm"
  cp "$VM_DIR/guest/init2" "$VM_JOB/.vm/init2"
}

# vm_add_files JOBDIR FILE...: copy files/dirs into the job dir (guest: /job/NAME).
vm_add_files() {
  local job=$1 f; shift
  for f in "$@"; do
    [ -e "$f" ] || { vm_log "no such file: $f"; exit 2; }
    [ "$(basename "$f")" != .vm ] || { vm_log "reserved name: $f"; exit 2; }
    cp -a -- "$f" "$job/"
  done
}

# vm_run JOBDIR PREFIX QEMU_ARGS...: boot one VM, stream its console (CRs and
# escape sequences stripped, each line prefixed with PREFIX), return qemu's
# (or timeout's) exit status. Always bounded by TIMEOUT (+10 s for SIGKILL).
vm_run() {
  local job=$1 prefix=$2; shift 2
  local qemu_args=("$@")
  vm_qemu_base_args "$job"
  local st=0
  # shellcheck disable=SC2086  # QEMU_EXTRA: extra qemu arguments, split on spaces
  timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 \
      "${VM_ACCEL_ARGS[@]}" "${VM_QEMU_ARGS[@]}" "${qemu_args[@]}" ${QEMU_EXTRA:-} < /dev/null 2>&1 |
    sed -u -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1b[()][A-Za-z0-9]//g' \
           -e 's/\x1b[=>c78]//g' -e "s/^/$prefix/" || st=${PIPESTATUS[0]}
  return "$st"
}

# vm_result JOBDIR QEMU_STATUS LABEL: print the outcome, echo the exit code:
# the job's exit code if it wrote one, else 124 (timeout) or 125 (no result).
vm_result() {
  local job=$1 qrc=$2 label=$3 rc
  if [ -s "$job/.vm/rc" ] && rc=$(cat "$job/.vm/rc") && [[ $rc =~ ^[0-9]+$ ]]; then
    echo "$rc"
  elif [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    vm_log "${label}TIMEOUT: killed after ${TIMEOUT}s"
    echo 124
  else
    vm_log "${label}no result from the VM (qemu exit status $qrc)"
    echo 125
  fi
}

# vm_kill_qemu JOBDIR: stop the qemu started for JOBDIR, by its pid file.
# qemu removes the file when it exits, but not when SIGKILLed, so check that
# the pid still is that qemu (its command line names JOBDIR) before killing.
vm_kill_qemu() {
  local pid
  pid=$(cat "$1/.vm/qemu.pid" 2>/dev/null) || return 0
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "path=$1,"; then
    kill -TERM "$pid" 2>/dev/null
  fi
  return 0
}

vm_elapsed() { # START_NS -> seconds with one decimal
  local ms=$(( ($(date +%s%N) - $1) / 1000000 ))
  printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100))
}
