#!/usr/bin/env bash
# Side-by-side benchmark: the Rust astro-agent against the Python `airflow edge worker`
# on one real Airflow 3 stack (see benchmarks/agent/README.md).
#
#   benchmarks/agent/run.sh [--quick] [--out FILE] [--workers astro-agent,python]
#
# Builds the agent (cargo build --release -p astro-agent, into the cached target folder),
# gets the cached Python venvs (tests/lib/venvs.sh), then runs bench.py, which starts and
# stops every process itself (by PID, also on failure or Ctrl-C). A full run takes about
# 15 minutes; --quick is a smoke run of a few minutes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
. tests/lib/cache.sh
. tests/lib/cargo-target.sh

bash tests/lib/prerequisites.sh

echo "==> cargo build --release -p astro-agent" >&2
cargo build --release -p astro-agent >&2
export ASTRO_AGENT_BIN="${ASTRO_AGENT_BIN:-$CARGO_TARGET_DIR/release/astro-agent}"
[ -x "$ASTRO_AGENT_BIN" ] || { echo "no agent binary at $ASTRO_AGENT_BIN" >&2; exit 1; }

echo "==> Python venvs" >&2
tools="$(bash tests/lib/venvs.sh tools)"
bash tests/lib/venvs.sh airflow >/dev/null

# exec: bench.py gets the signals itself and tears everything down on its way out.
exec "$tools/bin/python" benchmarks/agent/bench.py "$@"
