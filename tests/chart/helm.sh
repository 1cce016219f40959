#!/usr/bin/env bash
# Usage: helm.sh            prints the path of a pinned helm v3 binary, building it once.
#        helm.sh --mod M@V  downloads Go module M@V into the same module cache and prints its Dir.
# helm is built from the Go module proxy (no release download), cached under
# $ASTRO_CACHE_DIR/chart/helm-<version>/helm; an interrupted build leaves no binary behind.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib/cache.sh"
. "$here/pins.env"

command -v go >/dev/null || { echo "helm.sh: the Go toolchain is needed to build helm" >&2; exit 1; }
export GOMODCACHE="$ASTRO_CACHE_DIR/chart/gomod"
export GOFLAGS=-mod=mod
export GOTOOLCHAIN=local

if [ "${1:-}" = "--mod" ]; then
  # -json prints the module's Dir; the proxy is only asked when the cache lacks it.
  go mod download -json "$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
  exit 0
fi

dir="$ASTRO_CACHE_DIR/chart/helm-$HELM_VERSION"
if [ ! -x "$dir/helm" ]; then
  echo "building helm $HELM_VERSION from the Go module proxy (once) ..." >&2
  mkdir -p "$ASTRO_CACHE_DIR/chart"
  tmp="$(mktemp -d "$ASTRO_CACHE_DIR/chart/helm-build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # What helm's own Makefile stamps in: its version, and the Kubernetes version of the client-go it
  # is built with (the default .Capabilities.KubeVersion; without it helm assumes v1.20).
  src="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  kminor="$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$src/go.mod" | head -1)"
  [ -n "$kminor" ] || { echo "helm.sh: cannot read the client-go version of helm $HELM_VERSION" >&2; exit 1; }
  GOBIN="$tmp" go install \
    -ldflags "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kminor" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  mkdir -p "$dir"
  mv "$tmp/helm" "$dir/helm"
fi
echo "$dir/helm"
