#!/usr/bin/env bash
# Fetches released binaries, each checked against its published checksum,
# for machines that reach the projects' release downloads: a first
# make test then takes minutes instead of the half hour of building them from
# the Go module proxy. Exits 1, quietly but for one line, when a download
# host cannot be reached or a checksum does not match, and the caller then
# builds from source (this machine's case: it reaches only the Go module
# proxy).
#
#   hack/download.sh control-plane VERSION DIR  envtest's etcd and kube-apiserver
#                                              (as setup-envtest fetches them, from
#                                              controller-tools' envtest releases),
#                                              and kube-controller-manager,
#                                              kube-scheduler and kubectl from dl.k8s.io
#   hack/download.sh helm VERSION OUT          helm from get.helm.sh
set -euo pipefail

say() { echo "download: $*" >&2; }

# Where the releases are; a test points them at a server of its own.
ENVTEST_RELEASES=${ENVTEST_RELEASES:-https://raw.githubusercontent.com/kubernetes-sigs/controller-tools/HEAD/envtest-releases.yaml}
KUBERNETES_RELEASES=${KUBERNETES_RELEASES:-https://dl.k8s.io/release}
HELM_RELEASES=${HELM_RELEASES:-https://get.helm.sh}

case $(uname -m) in
  x86_64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) say "no released binaries for $(uname -m)"; exit 1 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# fetch URL OUT: quiet, with short timeouts, so an unreachable host costs
# seconds.
fetch() {
  curl -fsSL --connect-timeout 5 --retry 2 --max-time 600 -o "$2" "$1" 2>"$work/curl.err" || {
    say "cannot fetch $1 ($(tail -n1 "$work/curl.err"))"
    return 1
  }
}

# check FILE ALGO SUM
check() {
  local got
  got=$("${2}sum" "$1" | cut -d' ' -f1)
  if [ "$got" != "$3" ]; then
    say "$(basename "$1"): $2 $got, but the release publishes $3"
    return 1
  fi
}

# Each binary lands in place only once every one is fetched and checked.
control_plane() { # VERSION DIR
  local version=$1 dir=$2 start=$SECONDS
  local envtest="envtest-$version-linux-$arch.tar.gz"
  fetch "$ENVTEST_RELEASES" "$work/releases.yaml" || return 1
  local hash link
  hash=$(awk -v f="$envtest:" '$1 == f {found=1; next} found && $1 == "hash:" {print $2; exit}' "$work/releases.yaml")
  link=$(awk -v f="$envtest:" '$1 == f {found=1; next} found && $1 == "selfLink:" {print $2; exit}' "$work/releases.yaml")
  if [ -z "$hash" ] || [ -z "$link" ]; then
    say "controller-tools publishes no $envtest"
    return 1
  fi
  say "fetching $envtest"
  fetch "$link" "$work/envtest.tar.gz" && check "$work/envtest.tar.gz" sha512 "$hash" || return 1
  mkdir "$work/bin"
  tar -xzf "$work/envtest.tar.gz" -C "$work/bin" --strip-components=2
  for b in kube-controller-manager kube-scheduler kubectl; do
    say "fetching $b $version"
    local url="$KUBERNETES_RELEASES/$version/bin/linux/$arch/$b"
    fetch "$url" "$work/bin/$b" && fetch "$url.sha256" "$work/$b.sha256" || return 1
    check "$work/bin/$b" sha256 "$(cut -d' ' -f1 "$work/$b.sha256")" || return 1
  done
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -f "$work/bin/$b" ] || { say "$b is missing from the release"; return 1; }
  done
  chmod +x "$work/bin/"*
  mkdir -p "$dir"
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    mv "$work/bin/$b" "$dir/$b"
  done
  say "control plane $version fetched and checked in $((SECONDS - start))s"
}

helm() { # VERSION OUT
  local version=$1 out=$2 start=$SECONDS
  local tarball="helm-$version-linux-$arch.tar.gz"
  say "fetching $tarball"
  fetch "$HELM_RELEASES/$tarball" "$work/helm.tar.gz" && fetch "$HELM_RELEASES/$tarball.sha256sum" "$work/helm.sha256" || return 1
  check "$work/helm.tar.gz" sha256 "$(cut -d' ' -f1 "$work/helm.sha256")" || return 1
  tar -xzf "$work/helm.tar.gz" -C "$work" "linux-$arch/helm"
  mkdir -p "$(dirname "$out")"
  mv "$work/linux-$arch/helm" "$out"
  say "helm $version fetched and checked in $((SECONDS - start))s"
}

case ${1:-} in
  control-plane) [ $# -eq 3 ] || exit 2; control_plane "$2" "$3" ;;
  helm) [ $# -eq 3 ] || exit 2; helm "$2" "$3" ;;
  *) echo "usage: $0 control-plane VERSION DIR | helm VERSION OUT" >&2; exit 2 ;;
esac
