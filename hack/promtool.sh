#!/usr/bin/env bash
# Builds promtool, which tests the chart's alerting rules, from the Go module
# proxy (nothing else can be downloaded here) into bin/promtool-<version>,
# and prints its path. A cached build is reused. Prometheus 3's Go module
# is v0.3XX.Y for release v3.XX.Y.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
PROMETHEUS_MODULE_VERSION=${PROMETHEUS_MODULE_VERSION:-v0.316.0}
out=$PWD/bin/promtool-$PROMETHEUS_MODULE_VERSION
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
mkdir -p bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
echo "promtool: building $PROMETHEUS_MODULE_VERSION (a few minutes, once)" >&2
start=$SECONDS
# A throwaway module, so that Prometheus's dependencies never touch go.mod.
(cd "$work" && "$GO" mod init spillway.local/promtool >/dev/null 2>&1 \
  && "$GO" get "github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION" >&2 \
  && "$GO" build -trimpath -ldflags='-s -w' -o "$out.tmp.$$" github.com/prometheus/prometheus/cmd/promtool)
mv "$out.tmp.$$" "$out"
echo "promtool: built in $((SECONDS - start))s" >&2
echo "$out"
