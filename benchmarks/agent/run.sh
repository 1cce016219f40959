#!/usr/bin/env bash
# Side-by-side benchmark: the Rust astro-agent against the Python `airflow edge worker`
# on one real Airflow 3 stack (see benchmarks/agent/README.md).
#
#   benchmarks/agent/run.sh [--quick] [--out FILE] [--workers astro-agent,python]
#
# Builds the workspace's release binaries unless ASTRO_AGENT_BIN names one (into the cached
# target folder, the build the tests use) and gets the cached Python venvs (both in tests/lib/prologue.sh),
# then runs bench.py, which starts and stops every process itself (by PID, also on failure or
# Ctrl-C). A full run takes about 15 minutes; --quick is a smoke run of a few minutes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
. tests/lib/prologue.sh --airflow astro-agent

# exec: bench.py gets the signals itself and tears everything down on its way out.
exec "$python" benchmarks/agent/bench.py "$@"
