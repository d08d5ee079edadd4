#!/usr/bin/env bash
# Runs every test of go-rdma:
#   1. static checks (gofmt, go vet, CGO_ENABLED=0 build, darwin vet, a
#      linux/arm64 cross-build, staticcheck with and without cgo,
#      golangci-lint's depguard);
#   2. host tests with -race (soft provider; verbs tests skip: no device),
#      the nested module metrics/promrdma's too, then docs/guide.md's
#      getting started followed in a clean directory (test/guide/run.sh);
#   3. the verbs tests on Soft-RoCE (rdma_rxe) inside a qemu VM, with
#      RDMA_TEST_REQUIRE_DEVICE=1 so a skip is a failure, then in the same
#      VM the purego binding's (test binaries built with CGO_ENABLED=0):
#      internal/ibv, the conformance suite and a smoke and the rdma_cm
#      tests of the root package; then cmd/examples/http3's HTTP/3 over
#      rxe datagrams (with the veths' MTU raised for it, then restored);
#      then the conformance suite and the rdma_cm tests, of both bindings,
#      on siw (soft-iWARP; a conformance case may skip there only for a
#      feature siw lacks);
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
# metrics/promrdma, cmd/examples/raftkv, cmd/examples/antspool and
# cmd/examples/http3 are modules of their own (they require
# client_golang, hashicorp/raft, ants and quic-go, which the library's
# users need not get), so ./... above does not reach them.
nested=(metrics/promrdma cmd/examples/raftkv cmd/examples/antspool cmd/examples/http3)
for m in "${nested[@]}"; do (cd "$m" && go vet ./...); done
CGO_ENABLED=0 go build ./...
CGO_ENABLED=0 go vet ./...
GOOS=darwin go vet ./...
# Go services ship cross-built static binaries: linux/arm64 from here.
GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build ./...
GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go vet ./...
# and with cgo, through the cross compiler: this also checks the purego
# binding's mirror of abi.h (internal/ibv/abi.go) for arm64 (abi_cgo.go).
if command -v aarch64-linux-gnu-gcc >/dev/null; then
  GOOS=linux GOARCH=arm64 CGO_ENABLED=1 CC=aarch64-linux-gnu-gcc go build ./...
  GOOS=linux GOARCH=arm64 CGO_ENABLED=1 CC=aarch64-linux-gnu-gcc go vet ./internal/ibv
else
  if [ "$(uname -m)" = x86_64 ] && [ "$(id -u)" = 0 ]; then
    echo "no aarch64-linux-gnu-gcc: ensure_host_deps should have installed it"
    exit 1
  fi
  echo "no aarch64-linux-gnu-gcc (ensure_host_deps installs it as root on amd64): linux/arm64 cgo build skipped"
fi
# staticcheck is in go.mod's tool block. Without cgo, internal/ibv is the
# purego binding, so what is unused (U1000) differs: check both builds.
go tool staticcheck ./...
CGO_ENABLED=0 go tool staticcheck ./...
# golangci-lint (depguard: who imports internal/ibv, .golangci.yml) comes
# from its own module, tools/go.mod, so that go.mod stays small for the
# library's users. Its first build takes minutes; after that it is cached.
go tool -modfile=tools/go.mod golangci-lint run ./...

step "host tests (-race)"
hostlog=$(mktemp)
rc=0
go test -race -count=1 -v ./... > "$hostlog" 2>&1 || rc=$?
# Into the same log, so the counts below include the nested modules' tests.
for m in "${nested[@]}"; do
  (cd "$m" && go test -race -count=1 -v ./...) >> "$hostlog" 2>&1 || rc=$?
done
grep -E '^(ok|FAIL|---|panic:|\?)' "$hostlog" | grep -v -- '--- PASS\|--- SKIP' || true
if [ "$rc" != 0 ]; then
  echo "host tests failed; what the failed tests said:"
  grep -B 40 -A 5 -- '--- FAIL' "$hostlog" | head -n 300
  # A package can fail with no failed test: a goroutine left behind
  # (goleak in TestMain), a panic, a timeout.
  grep -A 30 -E '^(goleak|panic:|leak:)|Errors on successful test run' "$hostlog" | head -n 120
  echo "the end of their output:"
  tail -n 100 "$hostlog"
  echo "0 passed, $(grep -c -- '--- FAIL' "$hostlog") failed"
  exit 1
fi
host_passed=$(grep -c -- '--- PASS: ' "$hostlog")
host_skipped=$(grep -c -- '--- SKIP: ' "$hostlog")
echo "host: $host_passed passed, $host_skipped skipped (tests that need an RDMA device run in the VM below)"
rm -f "$hostlog"

step "scale tests without the race detector"
# The race detector runs 10x slower and allows 8,128 goroutines, so under
# -race these tests run at a tenth of their scale; here at full scale.
go test -count=1 -v -run '^TestBurstManyConns$' . 2>&1 | grep -E '^(---|ok|FAIL)|burst_test' || { echo "scale tests failed"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step "a program importing go-rdma builds without rdma-core's headers, cgo on and off"
# The two binaries it leaves in $work/apps run on rxe and siw in the VM
# (test/vm/apptests.sh).
mkdir -p "$work/apps"
test/build/noheaders.sh -o "$work/apps"

step "internal/ibv/abi.h matches rdma-core's headers"
go test -count=1 -tags rdmaheaders ./internal/ibv/abicheck

step "docs/guide.md's getting started, followed in a clean directory"
test/guide/run.sh

if [ "${SKIP_VM:-0}" = 1 ]; then
  step "SKIP_VM=1: VM tests skipped"
  echo "$host_passed passed, 0 failed"
  exit 0
fi

# Packages whose tests run on the rxe device in the VM.
VM_PKGS=(. stream internal/ibv internal/conformance cmd/examples/quickstart cmd/rdmacat)
bindir=$work/vmbin
mkdir -p "$bindir"
cp "$work/apps/app1" "$work/apps/app0" "$bindir/"
step "build test binaries for the VM"
specs=()
for p in "${VM_PKGS[@]}"; do
  b=$(echo "$p" | tr /. _r).test
  go test -c -o "$bindir/$b" "./$p"
  specs+=("$p=$b")
done
# Of cmd/rdmaperf's tests, those that need a device (the rest use soft).
go test -c -o "$bindir/cmd_rdmaperf.test" ./cmd/rdmaperf
specs+=("cmd/rdmaperf=cmd_rdmaperf.test@Verbs")
# cmd/rdmacat's tests run the command; the guest cannot build it.
go build -o "$bindir/rdmacat" ./cmd/rdmacat
# The purego binding (CGO_ENABLED=0): internal/ibv and the conformance
# suite in full, rdma_cm included, and the root package's basic paths,
# PacketConn and rdma_cm tests on it (siwtests.sh runs its rdma_cm tests on siw too).
PUREGO_PKGS=(internal/ibv internal/conformance .)
PUREGO_ROOT_TESTS='^(TestSendRecv|TestOneSided|TestUC|TestUCOverrun|TestWriteInline|TestBatch|TestPeerCloseErrors|TestDialErrors|TestVerbsRDMACM.*|TestPacket.*|TestVerbsPacket.*)$'
pspecs=()
for p in "${PUREGO_PKGS[@]}"; do
  b=purego_$(echo "$p" | tr /. _r).test
  CGO_ENABLED=0 go test -c -o "$bindir/$b" "./$p"
  pspecs+=("$p=$b")
done

# cmd/examples/http3 is a module of its own: its test binary is built
# there. test/vm/http3tests.sh runs it with the veths' MTU raised.
(cd cmd/examples/http3 && go test -c -o "$bindir/cmd_examples_http3.test" .)

# The tests run in their package directories (for testdata). The guest sees
# the host's root read-only but has its own /tmp, so ship a copy of the
# tracked sources with the binaries rather than rely on this checkout's path.
mkdir -p "$bindir/src"
git ls-files -z | xargs -0 tar cf - | tar xf - -C "$bindir/src"

step "verbs tests on rxe, then on siw, in one VM"
out=$work/vm.log
rc=0
job="cd $(basename "$bindir") && r=0
RDMACAT_BIN=\$PWD/rdmacat bash ../gotests.sh \$PWD/src ${specs[*]} || r=1
echo '=== the purego binding (CGO_ENABLED=0)'
bash ../gotests.sh \$PWD/src ${pspecs[*]:0:2} || r=1
GOTEST_FLAGS='-test.run=$PUREGO_ROOT_TESTS' bash ../gotests.sh \$PWD/src ${pspecs[2]} || r=1
echo '=== HTTP/3 over rxe datagrams (cmd/examples/http3)'
bash ../http3tests.sh \$PWD/src cmd_examples_http3.test || r=1
echo '=== siw'
bash ../siwtests.sh \$PWD/src || r=1
echo '=== a fresh program, built without rdma-core headers'
bash ../apptests.sh || r=1
exit \$r"
test/vm/run.sh -t 1800 -f "$bindir" -f test/vm/gotests.sh -f test/vm/http3tests.sh -f test/vm/siwtests.sh -f test/vm/apptests.sh -c "$job" | tee "$out" || rc=$?
# One VM-SUMMARY line per gotests.sh run: the cgo binding's, then the
# purego binding's two; http3tests.sh prints an HTTP3-SUMMARY (and
# renames its gotests.sh runs' lines), siwtests.sh a SIW-SUMMARY.
summary() { sed -n "s/.*VM-SUMMARY: .*$1=\([0-9]*\).*/\1/p" "$out" | sed -n "$2"; }
n=$(summary verbs_tests_passed 1p)
vm_all=$(summary all_tests_passed p | awk '{s += $1} END {print s + 0}')
np=$(summary verbs_tests_passed '2,$p' | awk '{s += $1} END {print s + 0}')
siw=$(sed -n 's/.*SIW-SUMMARY: passed=\([0-9]*\).*/\1/p' "$out" | tail -1)
siw_fskips=$(sed -n 's/.*SIW-SUMMARY: .*feature_skips=\([0-9]*\).*/\1/p' "$out" | tail -1)
echo "tests passed on the rxe device: ${n:-0} with the cgo binding, ${np:-0} with the purego binding; on siw: ${siw:-0} (conformance cases skipped for a feature siw lacks: ${siw_fskips:-0})"
[ "$rc" = 0 ] || { echo "VM tests failed (exit $rc)"; exit 1; }
[ "${n:-0}" -gt 0 ] || { echo "no test ran on the rxe device"; exit 1; }
[ "${np:-0}" -gt 0 ] || { echo "no test ran on the rxe device with the purego binding"; exit 1; }
[ "${siw:-0}" -gt 0 ] || { echo "no test ran on siw"; exit 1; }
apps=$(sed -n 's/.*APP-SUMMARY: passed=\([0-9]*\).*/\1/p' "$out" | tail -1)
[ "${apps:-0}" = 6 ] || { echo "the fresh program: ${apps:-0} of 6 checks passed in the VM (test/vm/apptests.sh)"; exit 1; }
h3=$(sed -n 's/.*HTTP3-SUMMARY: passed=\([0-9]*\).*/\1/p' "$out" | tail -1)
[ "${h3:-0}" = 2 ] || { echo "HTTP/3 over rxe: ${h3:-0} of 2 tests passed in the VM (test/vm/http3tests.sh)"; exit 1; }

step "two hosts: RC on rxe and the soft provider over TCP, between two VMs"
cp "$bindir/internal_ibv.test" "$work/ibv.test"
cp "$bindir/r.test" "$work/root.test"
out2=$work/vm2.log
rc=0
test/vm/run2.sh -t 600 -f "$work/ibv.test" -f "$work/root.test" -f test/vm/twohost.sh test/vm/twohost-server.sh test/vm/twohost-client.sh | tee "$out2" || rc=$?
[ "$rc" = 0 ] || { echo "two-VM tests failed (exit $rc)"; exit 1; }
n2=$(grep -cE -- '--- PASS: (TestVerbsTwoHostRC|TestTwoHostSoft|TestTwoHostVerbs)' "$out2" || true)
[ "$n2" = 6 ] || { echo "two-VM tests: $n2 of 6 passed (RC on rxe, the async API on rxe and on soft over TCP, each side)"; exit 1; }

step "done in $(( $(date +%s) - T0 ))s"
echo "rxe: $n tests passed on the rxe device in one VM (and $np with the purego binding); siw: ${siw:-0} passed (${siw_fskips:-0} conformance cases skipped for a feature siw lacks, docs/providers.md); two VMs: RC on rxe, the async API on rxe and on soft over TCP passed on both sides"
echo "$((host_passed + ${vm_all:-0} + ${siw:-0} + apps + h3 + n2)) passed, 0 failed"
