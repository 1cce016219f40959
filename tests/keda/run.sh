#!/usr/bin/env bash
# Proves the KEDA contract with KEDA's own code (see test_keda_contract.py): the chart's
# ScaledObjects and TriggerAuthentications go through KEDA's types, admission checks and scaler
# builder, and KEDA's metrics-api scaler, metrics server and fallback run against the real
# astro-sentinel fed by a real Airflow; KEDA's external-push scaler too (test_external_push.py).
#
#   tests/keda/run.sh [pytest args]     (e.g. tests/keda/test_external_push.py to run only that file)
#
# What it needs and fetches (cached under ${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}):
#   go/<go version>/{mod,build}  Go modules (KEDA pinned in go.mod) and the build cache
#   the pinned helm (tests/chart/helm.sh), the tools and airflow venvs (tests/lib/venvs.sh)
#   astro-sentinel: $ASTRO_SENTINEL_BIN, else the workspace's release build (cargo_release_build) into
#   the cached target folder (tests/lib/cargo-target.sh)
# Environment for experiments: KEDA_CONTRACT_CHART (another chart folder),
# KEDA_CONTRACT_EXTRA_VALUES (values files, ':'-separated, added to every scenario).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$root/tests/lib/cache.sh"
. "$root/tests/lib/cargo-target.sh"
bash "$root/tests/lib/prerequisites.sh" go

# One KEDA pin: go.mod must require the version the chart tests read the CRDs from.
. "$root/tests/chart/pins.env"
grep -Eq "^[[:space:]]*(require[[:space:]]+)?$KEDA_MODULE $KEDA_VERSION[[:space:]]*\$" "$here/go.mod" || {
  echo "tests/keda/go.mod does not require $KEDA_MODULE $KEDA_VERSION (tests/chart/pins.env)" >&2
  exit 1
}

gover="$(go env GOVERSION)"
export GOMODCACHE="$ASTRO_CACHE_DIR/go/$gover/mod"
export GOCACHE="$ASTRO_CACHE_DIR/go/$gover/build"
export GOFLAGS=-mod=mod
export GOTOOLCHAIN=local
mkdir -p "$GOMODCACHE" "$GOCACHE"

ASTRO_HELM="$(bash "$root/tests/chart/helm.sh")"
tools="$(bash "$root/tests/lib/venvs.sh" tools)"
if [ -z "${ASTRO_SENTINEL_BIN:-}" ]; then
  (cd "$root" && cargo_release_build)
  ASTRO_SENTINEL_BIN="$ASTRO_RELEASE_DIR/astro-sentinel"
fi
[ -x "$ASTRO_SENTINEL_BIN" ] || { echo "no astro-sentinel binary at $ASTRO_SENTINEL_BIN" >&2; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/astro-keda.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Compile once (KEDA without the scalers this project never configures, trimmed-modfile.sh; the
# first build is still long, later ones reuse GOCACHE); the driver runs the binary once per
# scenario and phase.
# One KEDA compile at a time: the cluster stage's background build (tests/cluster/build-keda.sh)
# takes the same lock, so whichever comes second finds the packages in GOCACHE.
start=$SECONDS
(
  flock 8
  cd "$here" && go test -c -modfile="$(bash trimmed-modfile.sh)" -ldflags="-s -w" -o "$work/kedacontract.test" .
) 8>"$(dirname "$GOCACHE")/keda-compile.lock"
echo "KEDA contract test binary built in $((SECONDS - start)) s (GOCACHE $GOCACHE)"

export ASTRO_HELM ASTRO_SENTINEL_BIN KEDA_CONTRACT_TEST_BIN="$work/kedacontract.test"
cd "$root"
# Both driver files unless the arguments name test files themselves.
files=(tests/keda/test_keda_contract.py tests/keda/test_external_push.py)
for arg in "$@"; do
  case "$arg" in *.py | *.py::*) files=() ;; esac
done
"$tools/bin/python" -m pytest -p no:cacheprovider -v -s "${files[@]}" "$@"
