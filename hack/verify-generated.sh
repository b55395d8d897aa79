#!/usr/bin/env bash
# Fails when the generated deepcopy code, the CRD (and the chart's copy of it),
# the RBAC, or the API and CLI references differ from what controller-gen,
# crd-ref-docs and hack/cli-reference make of the current sources.
# Generates into a copy of the work tree, so uncommitted work is compared as
# it is and left untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CONTROLLER_GEN:?set CONTROLLER_GEN to the controller-gen binary (make verify-generated does)}"
: "${CRD_REF_DOCS:?set CRD_REF_DOCS to the crd-ref-docs binary (make verify-generated does)}"

copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
tar --exclude=./bin --exclude=./.git -cf - . | tar -xf - -C "$copy"
(cd "$copy" && make --no-print-directory -s generate manifests CONTROLLER_GEN="$CONTROLLER_GEN" CRD_REF_DOCS="$CRD_REF_DOCS" >/dev/null)
stale=0
for dir in api config charts/spillway/crds docs; do
  if ! diff -r "$dir" "$copy/$dir"; then
    stale=1
  fi
done
if [ "$stale" -ne 0 ]; then
  echo "verify-generated: generated files are stale; run make generate manifests" >&2
  exit 1
fi
echo "verify-generated: generated files are up to date"
