#!/usr/bin/env bash
# The one-command demo (`make demo`): builds astro-agent and astro-sentinel, gets the cached
# Python venvs (both in tests/lib/prologue.sh), then runs demo/demo.py, which brings up Airflow 3
# + the Edge executor, the Sentinel and the local scaler, triggers a burst and checks that every
# task succeeded.
#
#   demo/run.sh            the full demo (48 tasks x 5 s, up to 4 workers; ~5-10 minutes)
#   demo/run.sh --short    a small burst (12 tasks x 2 s, up to 3 workers), what CI runs
#   demo/run.sh --help     every knob (tasks, syncSlots, max workers, polling, cooldown, ...)
#
# Slow things are cached under ${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent} (the same cargo
# target folder and venvs the test command uses), so a second run starts in seconds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
. tests/lib/prologue.sh --airflow astro-agent astro-sentinel

# exec: demo.py receives Ctrl-C / SIGTERM itself and stops everything it started.
exec "$python" demo/demo.py "$@"
