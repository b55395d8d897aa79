#!/usr/bin/env bash
# Fetches (hack/download.sh, where the release downloads are reachable) or
# else builds from the Go module proxy the kube-apiserver and etcd that
# envtest runs, and the kube-controller-manager, kube-scheduler and kubectl
# of the local cluster (test/kubeenv's StartCluster), and caches them under
# bin/control-plane/<kubernetes version>-released/ or
# bin/control-plane/<kubernetes version>-etcd<etcd version>/. Prints that
# directory, the value of KUBEBUILDER_ASSETS. A cached set is reused.
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
# The local cluster's binaries besides envtest's, built together: they share
# most of their packages, so one go build compiles them faster than three.
cluster_binaries="kube-controller-manager kube-scheduler kubectl"

api_version=$(GOFLAGS=-mod=mod "$GO" list -m -f '{{.Version}}' k8s.io/api)
minor=$(echo "$api_version" | cut -d. -f2)
kubernetes_version=v1.${minor}.${KUBERNETES_PATCH}
staging_version=v0.${minor}.${KUBERNETES_PATCH}

dir=$PWD/bin/control-plane/${kubernetes_version}-etcd${ETCD_VERSION}
# Released binaries, where the release downloads are reachable
# (hack/download.sh); their etcd is the one envtest's release bundles.
released=$PWD/bin/control-plane/${kubernetes_version}-released
complete() { # dir
  [ -x "$1/kube-apiserver" ] && [ -x "$1/etcd" ] || return 1
  for b in $cluster_binaries; do [ -x "$1/$b" ] || return 1; done
}
for d in "$dir" "$released"; do
  if complete "$d"; then
    echo "$d"
    exit 0
  fi
done
if hack/download.sh control-plane "$kubernetes_version" "$released"; then
  echo "$released"
  exit 0
fi
echo "control-plane: building from the Go module proxy instead (about 30 minutes the first time on 2 cores)" >&2
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

# Throwaway modules, one for etcd and one for the Kubernetes commands, so that
# their dependencies never touch go.mod.
build() { # module dir, main package, output
  (cd "$1" && "$GO" build -v -trimpath -ldflags='-s -w' -o "$3" "$2")
}

# progress runs a go build -v, printing every 30 seconds how many packages it
# has compiled so far and how long it has taken, and every other line (an
# error) as it comes. A cold Kubernetes build compiles a few thousand.
progress() { # label, command...
  local label=$1 start=$SECONDS last=$SECONDS count=0 line
  shift
  "$@" 2>&1 | while IFS= read -r line; do
    if [[ $line =~ ^[A-Za-z0-9._~-]+(/[A-Za-z0-9._~+-]+)*$ ]]; then
      count=$((count + 1))
      if ((SECONDS - last >= 30)); then
        last=$SECONDS
        echo "control-plane: $label: $count packages compiled in $((SECONDS - start))s" >&2
      fi
    else
      echo "$line" >&2
    fi
  done
}

if [ ! -x "$dir/etcd" ]; then
  echo "control-plane: building etcd $ETCD_VERSION" >&2
  start=$SECONDS
  mkdir "$work/etcd"
  (cd "$work/etcd" && "$GO" mod init spillway.local/etcd >/dev/null 2>&1 \
    && "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2)
  progress etcd build "$work/etcd" go.etcd.io/etcd/server/v3 "$dir/etcd.tmp"
  mv "$dir/etcd.tmp" "$dir/etcd"
  echo "control-plane: etcd built in $((SECONDS - start))s" >&2
fi

# kubernetes_module writes the throwaway module that builds commands of
# k8s.io/kubernetes into $work/kube, once.
kubernetes_module() {
  [ -f "$work/kube/go.mod" ] && return 0
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
  local cmds=""
  for b in kube-apiserver $cluster_binaries; do cmds="$cmds k8s.io/kubernetes/cmd/$b@$kubernetes_version"; done
  # shellcheck disable=SC2086 # one word per package
  (cd "$work/kube" && "$GO" get $cmds >&2)
}

if [ ! -x "$dir/kube-apiserver" ]; then
  echo "control-plane: building kube-apiserver $kubernetes_version (about 8 minutes cold)" >&2
  start=$SECONDS
  kubernetes_module
  progress kube-apiserver build "$work/kube" k8s.io/kubernetes/cmd/kube-apiserver "$dir/kube-apiserver.tmp"
  mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
  echo "control-plane: kube-apiserver built in $((SECONDS - start))s" >&2
fi

missing=""
for b in $cluster_binaries; do [ -x "$dir/$b" ] || missing="$missing $b"; done
if [ -n "$missing" ]; then
  echo "control-plane: building$missing $kubernetes_version (about 2 minutes once kube-apiserver's packages are in the build cache)" >&2
  start=$SECONDS
  kubernetes_module
  mkdir "$work/out"
  packages=""
  for b in $missing; do packages="$packages k8s.io/kubernetes/cmd/$b"; done
  # The release version, which kubectl version and the components' logs
  # show; a build from the module cache has none of its own.
  version_flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags="$version_flags -X $pkg.gitVersion=$kubernetes_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  done
  # shellcheck disable=SC2086 # one word per package
  progress "$(echo $missing | tr ' ' ,)" \
    bash -c 'cd "$1" && shift && exec "$@"' _ "$work/kube" \
    "$GO" build -v -trimpath -ldflags="-s -w $version_flags" -o "$work/out/" $packages
  for b in $missing; do mv "$work/out/$b" "$dir/$b.tmp" && mv "$dir/$b.tmp" "$dir/$b"; done
  echo "control-plane:$missing built in $((SECONDS - start))s" >&2
fi
echo "$dir"
