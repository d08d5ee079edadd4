#!/usr/bin/env bash
# Find the commit that moved a benchmark's metric: git bisect between a
# good and a bad revision, in a temporary worktree. Each step builds the
# package's test binary and runs its benchmark RUNS times alternating
# with the good revision's, and compares the medians of the metric: the
# step is bad when the candidate's is RATIO times the good one's or more
# (or, with -H, for a metric where more is better, RATIO times less). The
# good revision runs beside each candidate because the machine drifts
# more between steps than the two trees differ within one. A revision
# that does not build, or whose benchmark does not report the metric, is
# skipped.
#
# Usage: scripts/bench-bisect.sh [-n RUNS] [-t BENCHTIME] [-m METRIC] [-p PKG] [-H] GOOD BAD PATTERN RATIO
#   GOOD, BAD  revisions (e.g. b5710ea, HEAD)
#   PATTERN    -test.bench pattern; it should match one benchmark
#   RATIO      the dividing line, candidate/good, between 1 and BAD/GOOD
#              (run scripts/bench-ab.sh GOOD PATTERN first to see it)
#   -n RUNS    runs of each per step (default 8)
#   -t BENCHTIME  -test.benchtime (default 1s)
#   -m METRIC  the unit benchstat shows, e.g. p99-us (default), ns/op
#   -p PKG     package path relative to the module root (default ".")
#   -H         higher is better
# Prints each step's revision, medians and ratio, then the first bad
# commit.
#
# Example (the 64 KiB queue-depth-1 tail on soft, docs/performance.md):
#   scripts/bench-bisect.sh b5710ea HEAD 'Write/future/64KiB/qd1$' 1.35
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ "${1:-}" = --step ]; then
  # One bisect step, in the worktree (cwd), with the settings in the env.
  rev=$(git rev-parse --short HEAD)
  bin=$BISECT_WORK/step.test
  rm -f "$bin"
  if ! (cd "$BISECT_PKG" && go test -c -o "$bin" . >/dev/null 2>&1); then
    echo "$rev: does not build: skipped" | tee -a "$BISECT_LOG" >&2
    exit 125
  fi
  # run BINARY: the metric of one run of the benchmark, or nothing
  run() {
    (cd "$BISECT_PKG" && "$1" -test.run '^$' -test.bench "$BISECT_PATTERN" -test.benchtime "$BISECT_BENCHTIME" -test.count 1 2>/dev/null |
      awk -v m="$BISECT_METRIC" '/^Benchmark/ { for (i = 2; i < NF; i++) if ($(i+1) == m) { print $i; exit } }')
  }
  median() { sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
  good=() cand=()
  for _ in $(seq "$BISECT_RUNS"); do
    v=$(run "$BISECT_WORK/good.test"); [ -n "$v" ] && good+=("$v")
    v=$(run "$bin"); [ -n "$v" ] && cand+=("$v")
  done
  if [ ${#cand[@]} -eq 0 ]; then
    echo "$rev: no $BISECT_METRIC: skipped" | tee -a "$BISECT_LOG" >&2
    exit 125
  fi
  gm=$(printf '%s\n' "${good[@]}" | median)
  cm=$(printf '%s\n' "${cand[@]}" | median)
  read -r ratio bad < <(awk -v g="$gm" -v c="$cm" -v t="$BISECT_RATIO" -v h="$BISECT_HIGHER" \
    'BEGIN {r = c / g; printf "%.2f %d\n", r, (h ? r <= 1 / t : r >= t)}')
  verdict=good
  [ "$bad" = 1 ] && verdict=bad
  echo "$rev: $BISECT_METRIC median $cm against the good revision's $gm, ×$ratio: $verdict" | tee -a "$BISECT_LOG" >&2
  exit "$bad"
fi

RUNS=8 BENCHTIME=1s METRIC=p99-us PKG=. HIGHER=0
while getopts ":n:t:m:p:Hh" opt; do
  case $opt in
    n) RUNS=$OPTARG ;;
    t) BENCHTIME=$OPTARG ;;
    m) METRIC=$OPTARG ;;
    p) PKG=$OPTARG ;;
    H) HIGHER=1 ;;
    *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 4 ] || { echo "bench-bisect.sh: want GOOD BAD PATTERN RATIO (-h for usage)" >&2; exit 2; }
GOOD=$(git -C "$ROOT" rev-parse --verify "$1^{commit}") || { echo "bench-bisect.sh: no revision $1" >&2; exit 2; }
BAD=$(git -C "$ROOT" rev-parse --verify "$2^{commit}") || { echo "bench-bisect.sh: no revision $2" >&2; exit 2; }
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "bench-bisect.sh: -n wants a positive number" >&2; exit 2; }

work=$(mktemp -d)
cleanup() {
  git -C "$work/tree" bisect reset >/dev/null 2>&1 || true
  git -C "$ROOT" worktree remove --force "$work/tree" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
git -C "$ROOT" worktree add --detach -q "$work/tree" "$GOOD"
(cd "$work/tree/$PKG" && go test -c -o "$work/good.test" .) || { echo "bench-bisect.sh: the good revision does not build" >&2; exit 1; }
export BISECT_WORK=$work BISECT_LOG=$work/log BISECT_PKG=$PKG BISECT_RUNS=$RUNS \
  BISECT_BENCHTIME=$BENCHTIME BISECT_METRIC=$METRIC BISECT_PATTERN=$3 BISECT_RATIO=$4 \
  BISECT_HIGHER=$HIGHER
cd "$work/tree"
# The script itself runs from outside the worktree: old revisions lack it.
cp "$ROOT/scripts/bench-bisect.sh" "$work/step.sh"
git bisect start "$BAD" "$GOOD" >/dev/null
git bisect run bash "$work/step.sh" --step > "$work/run.log" 2>&1 || true
cat "$work/log"
grep -E '^[0-9a-f]+ is the first bad commit' -A 12 "$work/run.log" || tail -5 "$work/run.log"
