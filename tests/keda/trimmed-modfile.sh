#!/usr/bin/env bash
# Usage: tests/keda/trimmed-modfile.sh
# Prints the path of a go.mod (for `go build -modfile=`, from tests/keda) that builds KEDA without
# the scalers this project never configures: KEDA's source at the pinned version, its scaler
# files kept only for the triggers below, and its scaler builder without the cases whose scalers
# are gone (their trigger types then fail as unknown ones do). Every file kept is KEDA's own,
# unchanged but for those removed cases.
#
# Why: KEDA's scalers package imports the client of every system it can scale on (Elasticsearch's
# typed API alone is 4 555 Go files, Datadog's 1 204). Measured on the operator and the metrics
# API server: `go list -deps` counts 1 731 packages of 8 057 files instead of 3 454 of 18 838, and
# building them and the contract test from an empty build cache took 432 CPU-s instead of 929.
# KEDA was the largest Go build of a fresh machine's run, beside the Rust compile.
#
# Kept: the chart's triggers (metrics-api; external-push, in external_scaler.go), the ones that need
# no client (cpu, memory, cron, kubernetes-workload), prometheus, and azure-queue (its file
# declares a constant the kept scalers share).
#
# Cached beside the Go module cache, keyed by KEDA's version and this file: a second run prints
# the path at once. Needs KEDA's module downloaded (tests/keda's go.mod requires it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$root/tests/lib/cache.sh"
. "$root/tests/chart/pins.env"
kept=(metrics_api_scaler.go external_scaler.go cpu_memory_scaler.go cron_scaler.go
  kubernetes_workload_scaler.go prometheus_scaler.go azure_queue_scaler.go)

gover="$(go env GOVERSION)"
export GOMODCACHE="$ASTRO_CACHE_DIR/go/$gover/mod" GOFLAGS=-mod=mod GOTOOLCHAIN=local
key="$( { echo "$KEDA_MODULE $KEDA_VERSION"; cat "${BASH_SOURCE[0]}" "$here/go.mod" "$here/go.sum"; } | sha256sum | cut -c1-12)"
out="$ASTRO_CACHE_DIR/go/keda-trimmed-$key"
# One at a time: the cluster stage's background build and the KEDA contract stage both ask.
mkdir -p "$ASTRO_CACHE_DIR/go"
exec 9>"$ASTRO_CACHE_DIR/go/keda-trimmed.lock"
flock 9
if [ ! -f "$out/go.mod" ]; then
  src="$(cd "$here" && go mod download -json "$KEDA_MODULE@$KEDA_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [ -d "$src/pkg/scalers" ] || { echo "trimmed-modfile.sh: no KEDA source at '$src'" >&2; exit 1; }
  tmp="$(mktemp -d "$ASTRO_CACHE_DIR/go/.keda-trimmed.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  cp -R "$src" "$tmp/keda"
  chmod -R u+w "$tmp/keda"
  for file in "$tmp"/keda/pkg/scalers/*_scaler.go; do
    case " ${kept[*]} " in *" $(basename "$file") "*) ;; *) rm "$file" ;; esac
  done
  python3 - "$tmp/keda" <<'EOF'
import glob, re, sys
keda = sys.argv[1]
defined = set()
for path in glob.glob(f"{keda}/pkg/scalers/*.go"):
    defined |= set(re.findall(r"^func (New\w+)\(", open(path).read(), re.M))
builder = f"{keda}/pkg/scaling/scalers_builder.go"
lines, out, i = open(builder).read().split("\n"), [], 0
case = re.compile(r'\s*case "[^"]+":')
while i < len(lines):
    if not case.match(lines[i]):
        out.append(lines[i])
        i += 1
        continue
    end = i + 1
    while end < len(lines) and not re.match(r'\s*(case "|default:)', lines[end]):
        end += 1
    used = re.findall(r"scalers\.(New\w+)", "\n".join(lines[i:end]))
    if not used or all(name in defined for name in used):
        out.extend(lines[i:end])
    i = end
open(builder, "w").write("\n".join(out))
EOF
  cp "$here/go.mod" "$tmp/go.mod"
  cp "$here/go.sum" "$tmp/go.sum"
  (cd "$here" && go mod edit -modfile="$tmp/go.mod" -replace="$KEDA_MODULE=$out/keda")
  rm -rf "$out"
  mv -T "$tmp" "$out"
  trap - EXIT
fi
echo "$out/go.mod"
