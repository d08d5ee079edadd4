#!/bin/bash
# Guest job: the tests that run on siw (soft-iWARP), in the VM run.sh
# boots, after gotests.sh's rxe pass.
# Usage (inside the VM, cwd = the job's binaries): siwtests.sh REPO
#   REPO  the repository path, with internal_conformance.test,
#         internal_ibv.test, r.test (the root package) and stream.test in
#         cwd, and
#         purego_internal_conformance.test, purego_internal_ibv.test and
#         purego_r.test, the same built with CGO_ENABLED=0 (the purego
#         binding)
# The conformance suite runs on siw0/siw1 (RDMA_TEST_VERBS_DEVICES);
# internal/ibv's and the root package's rdma_cm tests run on the siw
# addresses (RDMA_VM_IP0/1 point at siw's pair instead of rxe's), and the
# root's iWARP test checks ErrNotSupported at the call; the stream's
# tests run over rdma_cm on siw (nettest included); then the same
# suite and rdma_cm tests with the purego binding. A skip is a
# failure, except a conformance case that skips for a feature the device
# lacks (docs/providers.md): each of those names it ("feature ...").
# Prints "SIW-SUMMARY: passed=N feature_skips=K" and exits non-zero on
# any failure or other skip.
set -u
repo=$1
ulimit -l unlimited
rc=0 passed=0 fskips=0
# The stream's tests that run on rdma_cm set-ups (eachProvider's
# verbs-rdma_cm subtests).
STREAM_CM_TESTS='^(TestStreamListenerSurvivesAbortedConnects|TestStreamNettest|TestStreamBasic|TestStreamSmallWindow|TestStreamSmallRing|TestStreamReadFromWriteTo|TestStreamCloseDuringCopy|TestStreamDeadlines|TestStreamCloseUnblocks|TestStreamPeerKilled|TestStreamHTTP|TestStreamGRPC)$/^verbs-rdma_cm$'
run() { # NAME PKG BINARY [ENV=VALUE]... -- [ARG]...
  local name=$1 pkg=$2 bin=$PWD/$3 envs=() log=/tmp/siw-$1.log brc
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  echo "=== siw: $name"
  (cd "$repo/$pkg" && env "${envs[@]}" timeout 900 "$bin" -test.v -test.count=1 -test.timeout=840s "$@") > "$log" 2>&1
  brc=$?
  cat "$log"
  local p s f
  p=$(grep -cE -- '--- PASS: ' "$log")
  s=$(grep -cE -- '--- SKIP: ' "$log")
  f=$(grep -cE -- ': feature "' "$log")
  passed=$((passed + p))
  if [ "${name%conformance}" != "$name" ]; then
    fskips=$((fskips + f))
    # TestSuiteCatchesFaults skips in the VM by design (host only).
    s=$((s - f - $(grep -cE -- '--- SKIP: TestSuiteCatchesFaults' "$log")))
  fi
  echo "=== siw: $name: exit $brc, $p passed, $s skipped without a lacking feature"
  { [ "$brc" = 0 ] && [ "$s" = 0 ] && [ "$p" -gt 0 ]; } || rc=1
}
run conformance internal/conformance internal_conformance.test \
  RDMA_TEST_PROVIDERS=verbs RDMA_TEST_VERBS_DEVICES=siw0,siw1 -- -test.run TestConformance
run ibv-rdma_cm internal/ibv internal_ibv.test \
  RDMA_VM_IP0="$RDMA_VM_SIW_IP0" RDMA_VM_IP1="$RDMA_VM_SIW_IP1" -- -test.run 'TestVerbsCM'
run root-rdma_cm . r.test \
  RDMA_VM_IP0="$RDMA_VM_SIW_IP0" RDMA_VM_IP1="$RDMA_VM_SIW_IP1" -- -test.run 'TestVerbsRDMACM|TestVerbsIWARP'
# The stream over rdma_cm (header mode: no immediate data on iWARP, and
# no credits of the library's on rdma_cm), its net.Conn contract included.
run stream-rdma_cm stream stream.test \
  RDMA_VM_IP0="$RDMA_VM_SIW_IP0" RDMA_VM_IP1="$RDMA_VM_SIW_IP1" -- -test.run "$STREAM_CM_TESTS"
run purego-conformance internal/conformance purego_internal_conformance.test \
  RDMA_TEST_PROVIDERS=verbs RDMA_TEST_VERBS_DEVICES=siw0,siw1 -- -test.run TestConformance
run purego-ibv-rdma_cm internal/ibv purego_internal_ibv.test \
  RDMA_VM_IP0="$RDMA_VM_SIW_IP0" RDMA_VM_IP1="$RDMA_VM_SIW_IP1" -- -test.run 'TestVerbsCM'
run purego-root-rdma_cm . purego_r.test \
  RDMA_VM_IP0="$RDMA_VM_SIW_IP0" RDMA_VM_IP1="$RDMA_VM_SIW_IP1" -- -test.run 'TestVerbsRDMACM|TestVerbsIWARP'
echo "SIW-SUMMARY: passed=$passed feature_skips=$fskips"
exit $rc
