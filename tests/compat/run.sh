#!/usr/bin/env bash
# The compatibility matrix: the agent and the Sentinel against the newest patch of every
# Airflow 3 minor, each with the newest Edge provider that supports it. A pair is a requirements
# file for the airflow venv: tests/compat/airflow-<minor>.txt, and for the newest minor the e2e
# stage's own tests/requirements-airflow.txt. For each pair one Airflow stack (its daemons, its
# Python edge worker and the tasks' Python all from that pair's venv) runs:
#   tests/e2e/test_compat_mix.py   success, failure, retry, mapped and two-slot task instances,
#                                  their logs shipped (both launch modes)
#   test_agent.py::test_sigterm_drains_running_tasks_and_reports_offline   the drain (both modes)
#   tests/e2e/test_sentinel_slots.py   the Sentinel's backlog in slots, REST and PostgreSQL sources
#
#   tests/compat/run.sh [MINOR]...    (default: every pair, oldest first; e.g. `run.sh 3.0`)
#   tests/compat/run.sh --venvs [MINOR]...   only build the pairs' venvs (cached; tests/run.sh
#                                            starts this in the background)
#
# The venvs are cached under ${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}, keyed by the
# requirements file's content. Ends with a table of each pair's result and wall time.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
. tests/lib/cache.sh
. tests/lib/cargo-target.sh

declare -A requirements=(
  [3.0]=tests/compat/airflow-3.0.txt
  [3.1]=tests/compat/airflow-3.1.txt
  [3.2]=tests/compat/airflow-3.2.txt
  [3.3]=tests/requirements-airflow.txt
  [3.3-oldest]=tests/compat/airflow-3.3-oldest.txt
)
# The default run: the newest patch of every minor with the newest Edge provider. Further pairs
# (the oldest Edge provider Airflow 3.3 installs with) run only when named.
all=(3.0 3.1 3.2 3.3)

venvs_only=
if [ "${1:-}" = --venvs ]; then venvs_only=1; shift; fi
minors=("$@")
[ ${#minors[@]} -gt 0 ] || minors=("${all[@]}")
for minor in "${minors[@]}"; do
  [ -n "${requirements[$minor]:-}" ] || { echo "tests/compat/run.sh: no pair for '$minor'; the pairs are: ${!requirements[*]}" >&2; exit 2; }
done

# A pin of FILE, extras and all: `name[extra]==1.0` is version 1.0 of name.
pinned() { sed -n "s/^$1\(\[[^]]*\]\)\?==//p" "$2"; }

# The venvs, side by side (downloads and unpacking; a cached one is ready at once).
pids=()
for minor in "${minors[@]}"; do
  bash tests/lib/venvs.sh airflow "${requirements[$minor]}" >/dev/null &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
[ -z "$venvs_only" ] || exit 0

export ASTRO_AGENT_BIN="${ASTRO_AGENT_BIN:-$ASTRO_RELEASE_DIR/astro-agent}"
export ASTRO_SENTINEL_BIN="${ASTRO_SENTINEL_BIN:-$ASTRO_RELEASE_DIR/astro-sentinel}"
[ -x "$ASTRO_AGENT_BIN" ] && [ -x "$ASTRO_SENTINEL_BIN" ] \
  || cargo_release_build
python="$(bash tests/lib/venvs.sh tools)/bin/python"
tests=(
  tests/e2e/test_compat_mix.py
  tests/e2e/test_agent.py::test_sigterm_drains_running_tasks_and_reports_offline
  tests/e2e/test_sentinel_slots.py
)

rows=()
failed=0
for minor in "${minors[@]}"; do
  file="${requirements[$minor]}"
  pair="Airflow $(pinned apache-airflow "$file") + edge3 $(pinned apache-airflow-providers-edge3 "$file")"
  printf '\n==> %s (%s)\n' "$pair" "$file"
  start=$SECONDS
  result=passed
  ASTRO_AIRFLOW_REQUIREMENTS="$file" "$python" -m pytest -p no:cacheprovider -v -n 3 "${tests[@]}" || { result=FAILED; failed=1; }
  rows+=("$(printf '  %-36s %-7s %dm %02ds' "$pair" "$result" $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)))")
done
printf '\n==> compatibility matrix\n'
printf '%s\n' "${rows[@]}"
exit "$failed"
