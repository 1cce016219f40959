#!/usr/bin/env bash
# One group of the cluster stage's scenarios, inside the private namespace run.sh made for it:
#
#   group.sh shared PYTHON PYTEST_ARGS...   the scenarios not marked `alone`, side by side in
#                                           $ASTRO_CLUSTER_PROCESSES pytest processes (pytest-xdist)
#                                           on infrastructure infra/driver.py starts once
#   group.sh alone PYTHON PYTEST_ARGS...    those marked `alone` (they stop what their group shares:
#                                           the API server, KEDA), one after another in one pytest
#                                           process, which starts its own infrastructure
#
# Exits with pytest's code (5: the files asked for have no scenario of that group).
set -euo pipefail
group="$1" python="$2"
shift 2
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if [ "$group" = alone ]; then
  exec "$python" -m pytest --durations=30 -m alone "$@"
fi
[ "$group" = shared ] || { echo "group.sh: unknown group '$group' (shared, alone)" >&2; exit 2; }

export ASTRO_CLUSTER_STATE="$ASTRO_CLUSTER_WORK/shared.json"
log="$ASTRO_CLUSTER_WORK/logs/shared-infrastructure.log"
mkdir -p "$(dirname "$log")"
started=$SECONDS
# The driver prints "ready" once everything is up, and closes its stdout: EOF without it means
# it failed (and stopped what it had started).
exec 3< <(PYTHONPATH="$PWD/tests/lib:$PWD/tests/cluster" exec "$python" -m infra.driver \
            --state "$ASTRO_CLUSTER_STATE" 2>"$log")
driver=$!
trap 'kill -TERM $driver 2>/dev/null; wait $driver || true; tail -n 3 "$log"' EXIT
ready=""
read -r ready <&3 || true
exec 3<&-
if [ "$ready" != ready ]; then
  echo "the shared infrastructure did not start; the end of $log:" >&2
  tail -n 80 "$log" >&2
  exit 1
fi
echo "shared infrastructure ready in $((SECONDS - started)) s"
"$python" -m pytest -n "$ASTRO_CLUSTER_PROCESSES" --dist loadfile --no-loadscope-reorder \
  --durations=30 -m "not alone" "$@"
