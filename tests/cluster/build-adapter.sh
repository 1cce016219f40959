#!/usr/bin/env bash
# Builds prometheus-adapter (sigs.k8s.io/prometheus-adapter, pinned in adapter/go.mod): the
# custom.metrics.k8s.io server behind the chart's HPA path. Prints the folder holding the binary,
# named prometheus-adapter (its command package is called `adapter`, as is KEDA's metrics API
# server, and build.sh links both into one folder).
#
# Cached under $ASTRO_CACHE_DIR/cluster/prometheus-adapter-<key>, the key covering the module's
# files, the Go version and the flags: a second run builds nothing. The build time goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$root/tests/lib/cache.sh"
. "$here/go-env.sh"

pkg=sigs.k8s.io/prometheus-adapter/cmd/adapter
flags=(-trimpath "-ldflags=-s -w")
key="$( (cd "$here/adapter" && cat go.mod go.sum ./*.go; echo "$gover ${flags[*]} $pkg") | sha256sum | cut -c1-12)"
out="$ASTRO_CACHE_DIR/cluster/prometheus-adapter-$key"
if [ ! -x "$out/prometheus-adapter" ]; then
  tmp="$(mktemp -d "$ASTRO_CACHE_DIR/cluster/.prometheus-adapter.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  start=$SECONDS
  echo "building prometheus-adapter ($pkg) ..." >&2
  (cd "$here/adapter" && go build "${flags[@]}" -o "$tmp/prometheus-adapter" "$pkg") >&2
  # Renamed into place only when complete: an interrupted build is never trusted.
  rm -rf "$out"
  mv -T "$tmp" "$out"
  echo "built prometheus-adapter in $((SECONDS - start)) s" >&2
fi
echo "$out"
