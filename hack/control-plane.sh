#!/usr/bin/env bash
# Builds the kube-apiserver and etcd that envtest runs, from the Go module
# proxy (nothing else can be downloaded here), and caches them under
# bin/control-plane/<kubernetes version>-etcd<etcd version>/. Prints that
# directory, the value of KUBEBUILDER_ASSETS. A cached build is reused.
#
# The Kubernetes minor comes from go.mod's k8s.io/api (v0.X.Y → v1.X), so an
# upgrade stays one edit. The patch is pinned: it must be a release whose
# k8s.io/kubernetes module builds, and v0.X.Y of the client libraries says
# nothing about which patch that is.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
KUBERNETES_PATCH=${KUBERNETES_PATCH:-2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}

api_version=$(GOFLAGS=-mod=mod "$GO" list -m -f '{{.Version}}' k8s.io/api)
minor=$(echo "$api_version" | cut -d. -f2)
kubernetes_version=v1.${minor}.${KUBERNETES_PATCH}
staging_version=v0.${minor}.${KUBERNETES_PATCH}

dir=$PWD/bin/control-plane/${kubernetes_version}-etcd${ETCD_VERSION}
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

# A throwaway module per binary, so neither's dependencies touch go.mod.
build() { # module dir, main package, output
  (cd "$1" && "$GO" build -trimpath -ldflags='-s -w' -o "$3" "$2")
}

if [ ! -x "$dir/etcd" ]; then
  echo "control-plane: building etcd $ETCD_VERSION" >&2
  start=$SECONDS
  mkdir "$work/etcd"
  (cd "$work/etcd" && "$GO" mod init spillway.local/etcd >/dev/null 2>&1 \
    && "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2)
  build "$work/etcd" go.etcd.io/etcd/server/v3 "$dir/etcd.tmp"
  mv "$dir/etcd.tmp" "$dir/etcd"
  echo "control-plane: etcd built in $((SECONDS - start))s" >&2
fi

if [ ! -x "$dir/kube-apiserver" ]; then
  echo "control-plane: building kube-apiserver $kubernetes_version (about 8 minutes cold)" >&2
  start=$SECONDS
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces
  # them with ./staging/...; a dependent module must replace each with the
  # published release of the same patch.
  gomod=$("$GO" mod download -json "k8s.io/kubernetes@$kubernetes_version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$gomod")
  if [ -z "$staging" ]; then
    echo "control-plane: found no staging replaces in $gomod" >&2
    exit 1
  fi
  mkdir "$work/kube"
  {
    echo "module spillway.local/kube"
    echo
    echo "go 1.26"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $staging_version"; done
    echo ")"
  } >"$work/kube/go.mod"
  echo "control-plane: replaced $(echo "$staging" | wc -w) staging modules with $staging_version" >&2
  (cd "$work/kube" && "$GO" get "k8s.io/kubernetes/cmd/kube-apiserver@$kubernetes_version" >&2)
  build "$work/kube" k8s.io/kubernetes/cmd/kube-apiserver "$dir/kube-apiserver.tmp"
  mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
  echo "control-plane: kube-apiserver built in $((SECONDS - start))s" >&2
fi
echo "$dir"
