#!/usr/bin/env bash
# Builds KEDA's operator and metrics API server (the commands cmd/operator and cmd/adapter of the
# KEDA module pinned in tests/chart/pins.env) for the cluster stage and prints the folder that
# holds them:
#
#   keda="$(bash tests/cluster/build-keda.sh)"
#   $keda/keda-operator, $keda/keda-metrics-apiserver, $keda/keda-config/ (KEDA's config/ folder:
#   the CRDs, RBAC, Services and APIService of a release install, at the same version)
#
# The binaries are built from the tests/keda module: its go.mod pins KEDA and the Kubernetes
# libraries for the KEDA contract stage, so both stages compile the same package versions with
# the same flags and share the Go module and build caches (whichever stage runs first pays for
# KEDA's dependency tree). Both build KEDA without the scalers this project never configures
# (tests/keda/trimmed-modfile.sh says which stay and why).
#
# Cached under ${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}/cluster/keda-<key>/, the key covering
# tests/keda's go.mod and go.sum, the Go version and the build flags: a second run prints the
# folder at once. The build time goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
module="$root/tests/keda"
. "$root/tests/lib/cache.sh"
. "$here/go-env.sh"

. "$root/tests/chart/pins.env"
grep -Eq "^[[:space:]]*(require[[:space:]]+)?$KEDA_MODULE $KEDA_VERSION[[:space:]]*\$" "$module/go.mod" || {
  echo "tests/keda/go.mod does not require $KEDA_MODULE $KEDA_VERSION (tests/chart/pins.env)" >&2
  exit 1
}

# KEDA's release images stamp version.Version: it is logged at start-up, put into the
# app.kubernetes.io/version label of the HPAs KEDA creates and into keda_build_info. The module
# proxy does not carry the tag's commit, so version.GitCommit stays empty.
ldflags="-s -w -X=$KEDA_MODULE/version.Version=${KEDA_VERSION#v}"
# No -trimpath: the build cache keys every compiled package on it and tests/keda/run.sh builds
# without it, so with it KEDA's whole dependency tree would be compiled a second time (some ten
# CPU minutes and gigabytes of cache) instead of being shared with the contract stage.
modfile="$(bash "$module/trimmed-modfile.sh")"
flags=("-ldflags=$ldflags" "-modfile=$modfile")
cgo="$(go env CGO_ENABLED)"
layout=2 # bump when the folder's contents change

key="$( {
  printf '%s\n' "layout $layout" "$gover" "$(go env GOOS)/$(go env GOARCH)" "CGO_ENABLED=$cgo" "${flags[@]}"
  cat "$module/go.mod" "$module/go.sum"
} | sha256sum | cut -c1-12)"
out="$ASTRO_CACHE_DIR/cluster/keda-$key"
# One KEDA compile at a time (tests/keda/run.sh takes the same lock): the test command runs this
# build in the background while the KEDA contract stage may be compiling the same packages, and
# the Go build cache does not share work in flight.
exec 8>"$(dirname "$GOCACHE")/keda-compile.lock"
flock 8
if [ ! -x "$out/keda-operator" ]; then
  tmp="$(mktemp -d "$ASTRO_CACHE_DIR/cluster/.keda.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  start=$SECONDS
  echo "building KEDA $KEDA_VERSION (cmd/operator, cmd/adapter) ..." >&2
  # From the module folder, so its go.mod (and the replace block copied from KEDA's) applies. Two
  # builds with -o FILE: both commands' packages are named main, and the second only links.
  (cd "$module" && go build "${flags[@]}" -o "$tmp/keda-operator" "$KEDA_MODULE/cmd/operator") >&2
  (cd "$module" && go build "${flags[@]}" -o "$tmp/keda-metrics-apiserver" "$KEDA_MODULE/cmd/adapter") >&2
  # The install manifests travel with the binaries: the stage runs without network access, and
  # they must match the code that needs them (the operator's RBAC comes from its kubebuilder
  # markers). The module cache is read-only: copy, then make the copy removable.
  moddir="$(cd "$module" && go list -modfile="$modfile" -m -f '{{.Dir}}' "$KEDA_MODULE")"
  cp -R "$moddir/config" "$tmp/keda-config"
  chmod -R u+w "$tmp/keda-config"
  echo "built KEDA $KEDA_VERSION in $((SECONDS - start)) s" >&2
  # Renamed into place only when complete: an interrupted build is never trusted.
  rm -rf "$out"
  mv -T "$tmp" "$out"
fi
echo "$out"
