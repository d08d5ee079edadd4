#!/usr/bin/env bash
# Runs every test of go-rdma:
#   1. static checks (gofmt, go vet, CGO_ENABLED=0 build, darwin vet);
#   2. host tests with -race (soft provider; verbs tests skip: no device);
#   3. the verbs tests on Soft-RoCE (rdma_rxe) inside a qemu VM, with
#      RDMA_TEST_REQUIRE_DEVICE=1 so a skip is a failure;
#   4. an RC test between two VMs.
# As root on a fresh Debian 12 machine it installs what is missing (apt
# packages and the Debian kernel image for the VM).
# Env: SKIP_VM=1 runs only 1 and 2 (for quick local iterations).
set -euo pipefail
cd "$(dirname "$0")"
. scripts/deps.sh
T0=$(date +%s)
step() { printf '\n==> [%ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

step "host dependencies"
ensure_host_deps

step "static checks"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$bad" ] || { echo "gofmt would change:"; echo "$bad"; exit 1; }
go vet ./...
CGO_ENABLED=0 go build ./...
CGO_ENABLED=0 go vet ./...
GOOS=darwin go vet ./...

step "host tests (-race)"
go test -race -count=1 ./...

[ "${SKIP_VM:-0}" = 1 ] && { step "SKIP_VM=1: VM tests skipped"; exit 0; }

# Packages whose tests run on the rxe device in the VM.
VM_PKGS=(. internal/ibv internal/conformance)
bindir=$(mktemp -d)
trap 'rm -rf "$bindir"' EXIT
step "build test binaries for the VM"
specs=()
for p in "${VM_PKGS[@]}"; do
  b=$(echo "$p" | tr /. _r).test
  go test -c -o "$bindir/$b" "./$p"
  specs+=("$p=$b")
done

step "verbs tests on rxe in one VM"
out=$bindir/vm.log
rc=0
test/vm/run.sh -t 900 -f "$bindir" -f test/vm/gotests.sh -c "cd $(basename "$bindir") && bash ../gotests.sh $PWD ${specs[*]}" | tee "$out" || rc=$?
n=$(sed -n 's/.*VM-SUMMARY: verbs_tests_passed=\([0-9]*\).*/\1/p' "$out" | tail -1)
echo "tests passed on the rxe device: ${n:-0}"
[ "$rc" = 0 ] || { echo "VM tests failed (exit $rc)"; exit 1; }
[ "${n:-0}" -gt 0 ] || { echo "no test ran on the rxe device"; exit 1; }

step "done in $(( $(date +%s) - T0 ))s"
