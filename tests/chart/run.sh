#!/usr/bin/env bash
# Runs the Helm chart tests: builds (once) the chart venv and the pinned helm, fetches (once) the
# KEDA and prometheus-operator modules for their CRDs, then pytest. Extra arguments go to pytest.
# Exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$root/tests/lib/cache.sh"

venv="$(bash "$root/tests/lib/venvs.sh" chart)"
ASTRO_HELM="$(bash "$here/helm.sh")"
export ASTRO_HELM
. "$here/pins.env"
ASTRO_KEDA_MODULE_DIR="$(bash "$here/helm.sh" --mod "$KEDA_MODULE@$KEDA_VERSION")"
ASTRO_PROMETHEUS_OPERATOR_MODULE_DIR="$(bash "$here/helm.sh" --mod "$PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION")"
export ASTRO_KEDA_MODULE_DIR ASTRO_PROMETHEUS_OPERATOR_MODULE_DIR

cd "$root"
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q tests/chart "$@"
