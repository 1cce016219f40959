#!/usr/bin/env bash
# Builds Prometheus and promtool (github.com/prometheus/prometheus, pinned in prometheus/go.mod)
# with Kubernetes service discovery: the stage's Prometheus finds worker pods through the API
# server as a cluster's does, and Debian's prometheus package is built without that discovery.
# Only the Kubernetes (and the always-present file and HTTP) discovery is compiled in, which
# keeps every cloud SDK out of the build. Without the `builtinassets` tag the web UI is absent;
# the HTTP API the tests use is all there. Prints the folder holding both binaries.
#
# Cached under $ASTRO_CACHE_DIR/cluster/prometheus-<key>, the key covering the module's files,
# the Go version and the flags: a second run builds nothing. The build time goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$root/tests/lib/cache.sh"
. "$here/go-env.sh"

module=github.com/prometheus/prometheus
mod_version="$(awk -v m="$module" '$1 == "require" && $2 == m {print $3}' "$here/prometheus/go.mod")"
[ -n "$mod_version" ] || { echo "build-prometheus.sh: prometheus/go.mod does not require $module" >&2; exit 1; }
# Module v0.MMM.P is Prometheus 3.MMM-300.P: stamp that, as its release builds do.
version="$(echo "$mod_version" | awk -F. '{printf "3.%d.%s", $2 - 300, $3}')"
tags=remove_all_sd,enable_kubernetes_sd
ldflags="-s -w -X github.com/prometheus/common/version.Version=$version -X github.com/prometheus/common/version.Branch=$mod_version"
key="$( (cd "$here/prometheus" && cat go.mod go.sum ./*.go; echo "$gover $tags $ldflags") | sha256sum | cut -c1-12)"
out="$ASTRO_CACHE_DIR/cluster/prometheus-$key"
if [ ! -x "$out/prometheus" ] || [ ! -x "$out/promtool" ]; then
  tmp="$(mktemp -d "$ASTRO_CACHE_DIR/cluster/.prometheus.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  start=$SECONDS
  echo "building prometheus $version ($module $mod_version) ..." >&2
  (cd "$here/prometheus" && go build -trimpath -tags "$tags" -ldflags="$ldflags" -o "$tmp/" \
    "$module/cmd/prometheus" "$module/cmd/promtool") >&2
  # Renamed into place only when complete: an interrupted build is never trusted.
  rm -rf "$out"
  mv -T "$tmp" "$out"
  echo "built prometheus in $((SECONDS - start)) s" >&2
fi
echo "$out"
