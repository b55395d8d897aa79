#!/usr/bin/env bash
# Runs integration suites RUNS times in a row while busy loops keep every
# core loaded, so that a spec racing its own signals fails here, on a fast
# machine, instead of on a slower one. Stops at the first failing run.
#
#   hack/stress.sh [package ...]      default: ./drainer ./test/process
#   RUNS=20 LOAD=2 LABELS='db || broker || process' hack/stress.sh ./drainer
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
RUNS=${RUNS:-20}
LOAD=${LOAD:-$(nproc)}
LABELS=${LABELS:-db || broker || process}
packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(./drainer ./test/process)

work=$(mktemp -d)
load=()
cleanup() {
  [ ${#load[@]} -eq 0 ] || kill "${load[@]}" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# One test binary per package, built before the load starts.
binaries=()
for pkg in "${packages[@]}"; do
  bin="$work/$(echo "$pkg" | tr -c 'a-zA-Z0-9\n' '_').test"
  "$GO" test -c -o "$bin" "$pkg"
  binaries+=("$pkg=$bin")
done

for _ in $(seq 1 "$LOAD"); do
  (while :; do :; done) &
  load+=($!)
done
echo "stress: $RUNS runs of ${packages[*]} (labels: $LABELS) beside $LOAD busy loops"

start=$SECONDS
for run in $(seq 1 "$RUNS"); do
  for entry in "${binaries[@]}"; do
    pkg=${entry%%=*} bin=${entry#*=}
    # A test binary runs in its package's directory, as go test runs it.
    if ! (cd "$pkg" && "$bin" -test.timeout 20m -ginkgo.label-filter="$LABELS" -ginkgo.no-color >"$work/out" 2>&1); then
      cat "$work/out"
      echo "stress: FAILED in run $run of $RUNS: $pkg ($((SECONDS - start))s)"
      exit 1
    fi
    echo "stress: run $run/$RUNS $pkg: $(grep -Eo 'Ran [0-9]+ of [0-9]+ Specs in [0-9.]+ seconds' "$work/out")"
  done
done
echo "stress: $RUNS runs of ${packages[*]} passed beside $LOAD busy loops in $((SECONDS - start))s"
