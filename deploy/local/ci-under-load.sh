#!/usr/bin/env bash
# The "never flakes" check: run CI's test command N times in a row, each on a fresh clone of
# HEAD, with two busy processes competing for the cores throughout (as `stress --cpu 2`
# would). Prints one line per run and a summary; exits non-zero if any run failed.
#   bash deploy/local/ci-under-load.sh [runs=10] [busy=2]
set -uo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-10}; busy=${2:-2}
repo=$(pwd); head=$(git rev-parse --short HEAD)
work=$(mktemp -d /tmp/ci-under-load.XXXX)
hogs=()
for _ in $(seq "$busy"); do (while :; do :; done) & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
echo "commit $head, $runs runs, $busy busy processes, logs in $work"
failed=0
for i in $(seq "$runs"); do
  # every run on the same commit, even if the repository moves on meanwhile
  git clone -q "$repo" "$work/run-$i" && git -C "$work/run-$i" checkout -q "$head"
  start=$(date +%s)
  # -v names the test a dying xdist worker was running; faulthandler_timeout dumps every
  # thread's stack if one test hangs; the outer timeout ends a wedged run.
  (cd "$work/run-$i" && CI=true PYTEST_ADDOPTS="-v -o faulthandler_timeout=600" \
     timeout -k 30 2400 bash .ci/run) > "$work/run-$i.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  summary=$(grep -aE '^=+ .*(passed|failed|error).* =+$' "$work/run-$i.log" | tail -1)
  echo "run $i: rc=$rc, ${took}s, $summary"
  [ $rc -eq 0 ] || failed=$((failed + 1))
  rm -rf "$work/run-$i"
  [ $rc -eq 0 ] || grep -aE 'FAILED|ERROR|crashed|node down|Timeout' "$work/run-$i.log" | head -20
done
echo "summary: $((runs - failed))/$runs green at $head under $busy busy processes"
[ $failed -eq 0 ]
