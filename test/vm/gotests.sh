#!/bin/bash
# Guest job: run Go test binaries built on the host against the rxe devices.
# Usage (inside the VM, cwd = job dir): gotests.sh REPO PKG=BINARY[@RUN]...
#   REPO     the repository path on the host (visible read-only in the guest)
#   PKG      package directory relative to REPO; the test runs there, so it
#            finds its testdata
#   BINARY   test binary in the job dir (from `go test -c`)
#   RUN      only the tests that match this -test.run pattern
# Env: GOTEST_FLAGS, extra flags for every binary (e.g. -test.skip=CM).
# Prints each binary's verbose output and a summary line counting the
# subtests that passed on the verbs provider (test names containing
# "verbs"); exits non-zero if any binary failed.
set -u
repo=$1; shift
ulimit -l unlimited
ulimit -n 20000 2>/dev/null || true # the many-connection tests
rc=0 verbs_passed=0 all_passed=0
for spec in "$@"; do
  run=()
  case $spec in *@*) run=("-test.run=${spec##*@}") spec=${spec%@*} ;; esac
  pkg=${spec%%=*} bin=$PWD/${spec#*=}
  echo "=== go test $pkg (in the VM)"
  log=/tmp/$(basename "$bin").log
  (cd "$repo/$pkg" && timeout 1500 "$bin" -test.v -test.count=1 -test.timeout=1440s "${run[@]}" ${GOTEST_FLAGS:-}) > "$log" 2>&1
  brc=$?
  cat "$log"
  n=$(grep -cE -- '--- PASS: .*[Vv]erbs' "$log")
  verbs_passed=$((verbs_passed + n))
  all_passed=$((all_passed + $(grep -cE -- '--- PASS: ' "$log")))
  echo "=== $pkg: exit $brc, $n verbs tests passed"
  [ "$brc" = 0 ] || rc=1
done
echo "VM-SUMMARY: verbs_tests_passed=$verbs_passed all_tests_passed=$all_passed"
exit $rc
