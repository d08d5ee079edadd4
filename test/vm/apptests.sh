#!/bin/bash
# Guest job: a fresh program that imports go-rdma, built by
# test/build/noheaders.sh on the host without rdma-core's headers, with
# cgo (app1) and with CGO_ENABLED=0 (app0), run on the VM's devices: each
# lists rxe0 as usable and moves data on it, and moves data on siw
# through rdma_cm (iWARP connects only through it): app1 with the cgo
# binding's librdmacm, app0 with the purego one's.
# Usage (inside the VM, cwd = the job's binaries): apptests.sh
# Prints "APP-SUMMARY: passed=N" and exits non-zero on any failure.
set -u
ulimit -l unlimited
rc=0 passed=0
check() { # NAME WANT CMD...
  local name=$1 want=$2 out
  shift 2
  out=$(timeout 120 "$@" 2>&1)
  echo "$out"
  if grep -qF -- "$want" <<<"$out"; then
    passed=$((passed + 1))
    echo "=== app: $name: ok"
  else
    rc=1
    echo "=== app: $name: FAILED (want \"$want\")"
  fi
}
for b in app1 app0; do
  check "$b lists rxe0" "device rxe0 (verbs, usable true)" "./$b"
  check "$b moves data on rxe0" "moved 65536 bytes on rxe0 (verbs)" "./$b" move rxe0
done
for b in app1 app0; do
  check "$b moves data on siw through rdma_cm" "moved 65536 bytes on siw" "./$b" move-cm "${RDMA_VM_SIW_IP0:?not in the VM?}"
done
echo "APP-SUMMARY: passed=$passed"
exit $rc
