#!/usr/bin/env bash
# A/B benchmarks: the work tree against a base revision, in one run.
#
# Builds the test binary of each package for BASE (a git revision, in a
# temporary worktree) and for the work tree (uncommitted changes included),
# then runs the chosen benchmarks of the two alternately, ROUNDS times, so
# that both see the same machine, and prints benchstat's comparison
# (ns/op, B/op, allocs/op and the benchmarks' own metrics such as Gb/s).
# A base older than the root benchmarks' slow-% metric is given it.
#
# Usage: scripts/bench-ab.sh [-n ROUNDS] [-t BENCHTIME] [-p "PKGS"] [-o OUT] [-P] [-V "ARGS"] BASE [PATTERN]
#   BASE      a revision: a tag, a commit (e.g. b5710ea for v0.1.0)
#   PATTERN   -test.bench pattern (default ".": every benchmark)
#   -n ROUNDS alternating rounds (default 6; benchstat wants >= 6 for its
#             confidence intervals)
#   -t BENCHTIME  -test.benchtime (default 1s; "2000x" for a fixed count)
#   -p PKGS   packages, as paths relative to the module root (default ".")
#   -o OUT    directory for base.txt, head.txt and ab.txt (default a new
#             directory under $TMPDIR, kept)
#   -P        also take a CPU profile of the last round of each tree
#             (OUT/{base,head}.<pkg>.cpu.pprof; `go tool pprof` reads them)
#   -V ARGS   then run test/perf/compare.sh's points for both trees in one
#             VM session on rxe (compare.sh -B BASE ARGS -o OUT/vm, e.g.
#             -V "-r 3 -T 'send_lat write_lat'"): the async API and the
#             stream of each tree against the same perftest. PATTERN "-"
#             skips the Go benchmarks.
# Env: BENCH_AB_ARGS  more flags for the test binaries (e.g. "-test.cpu 1").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=6 BENCHTIME=1s PKGS=. OUT= PROFILE=0 VM=
while getopts ":n:t:p:o:PV:h" opt; do
  case $opt in
    n) ROUNDS=$OPTARG ;;
    t) BENCHTIME=$OPTARG ;;
    p) PKGS=$OPTARG ;;
    o) OUT=$OPTARG ;;
    P) PROFILE=1 ;;
    V) VM=$OPTARG ;;
    *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "bench-ab.sh: want BASE [PATTERN] (-h for usage)" >&2; exit 2; }
BASE=$1 PATTERN=${2:-.}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bench-ab.sh: -n wants a positive number" >&2; exit 2; }
base_rev=$(git -C "$ROOT" rev-parse --verify "$BASE^{commit}") || { echo "bench-ab.sh: no revision $BASE" >&2; exit 2; }

work=$(mktemp -d)
cleanup() {
  git -C "$ROOT" worktree remove --force "$work/base" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
[ -n "$OUT" ] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/bench-ab.XXXXXX")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
git -C "$ROOT" worktree add --detach -q "$work/base" "$base_rev"
# A base whose root bench_test.go predates the slow-% metric (the share
# of operations slower than 4× the median) gets the work tree's two
# lines of it, so that benchstat compares it too.
bt=$work/base/bench_test.go
if [ -f "$bt" ] && ! grep -q 'slow-%' "$bt" && grep -q 'b.ReportMetric(at(0.99), "p99-us")' "$bt"; then
  sed -i -e '/b.ReportMetric(at(0.99), "p99-us")/a\
	slow := len(l.d) - sort.Search(len(l.d), func(i int) bool { return l.d[i] > 4*l.d[len(l.d)/2] })\
	b.ReportMetric(100*float64(slow)/float64(len(l.d)), "slow-%")' \
    -e '0,/^\t"slices"$/s//\t"slices"\n\t"sort"/' "$bt"
fi

# build TREE NAME: the test binaries of PKGS in TREE, as $work/bin/NAME.<pkg>.test
build() {
  local tree=$1 name=$2 p b
  for p in $PKGS; do
    b=$(echo "$p" | tr /. _r)
    if [ -d "$tree/$p" ]; then
      (cd "$tree" && go test -c -o "$work/bin/$name.$b.test" "./$p")
    else
      echo "bench-ab.sh: $name has no package $p" >&2
    fi
  done
}
# vm_ab: compare.sh's points of both trees in one VM session (-V).
vm_ab() {
  [ -n "$VM" ] || return 0
  # ARGS is a word list, quoted as the caller wrote it: eval splits it so.
  eval "\"$ROOT/test/perf/compare.sh\" -B \"$BASE\" -o \"$OUT/vm\" $VM"
}
if [ "$PATTERN" = - ]; then
  vm_ab
  exit
fi
mkdir -p "$work/bin"
echo "building $BASE ($base_rev) and the work tree ($(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD || echo +changes))" >&2
build "$work/base" base
build "$ROOT" head

# run NAME TREE ROUND: one round of every package's benchmarks, appended to OUT/NAME.txt
run() {
  local name=$1 tree=$2 round=$3 p b bin prof=()
  for p in $PKGS; do
    b=$(echo "$p" | tr /. _r)
    bin=$work/bin/$name.$b.test
    [ -x "$bin" ] || continue
    prof=()
    [ "$PROFILE" = 1 ] && [ "$round" = "$ROUNDS" ] && prof=(-test.cpuprofile "$OUT/$name.$b.cpu.pprof")
    # shellcheck disable=SC2086 # BENCH_AB_ARGS is a word list
    (cd "$tree/$p" && "$bin" -test.run '^$' -test.bench "$PATTERN" -test.benchmem \
      -test.benchtime "$BENCHTIME" -test.count 1 "${prof[@]}" ${BENCH_AB_ARGS:-}) >> "$OUT/$name.txt"
  done
}
: > "$OUT/base.txt"
: > "$OUT/head.txt"
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r of $ROUNDS" >&2
  # Alternate which goes first, so neither always runs on a warmer machine.
  if [ $((r % 2)) = 1 ]; then
    run base "$work/base" "$r"; run head "$ROOT" "$r"
  else
    run head "$ROOT" "$r"; run base "$work/base" "$r"
  fi
done
(cd "$ROOT/tools" && go tool benchstat "base=$OUT/base.txt" "head=$OUT/head.txt") | tee "$OUT/ab.txt"
vm_ab
echo "raw results in $OUT" >&2
