#!/usr/bin/env bash
# Benchmark of astro-sentinel: cached GET /v1/workers/{name} throughput and p99 latency with
# static-token auth on (wrk on loopback, 200 workers over 50 queues), the Sentinel's RSS, and
# upstream requests/queries per refresh for both sources, with and without load.
#
# Usage: benchmarks/sentinel/run.sh            (from anywhere; prints the figures)
# Env:   ASTRO_SENTINEL_BIN  use this binary instead of building target/release/astro-sentinel
#        BENCH_DURATION      seconds per wrk run (default 10), BENCH_RUNS runs (default 3; the median is judged)
#        BENCH_CONNECTIONS   wrk connections (default 16), BENCH_THREADS wrk threads (default 1)
#
# No Airflow is needed: the airflow-api source reads a tiny fake REST API (fake_airflow.py) and
# the postgres source a private PostgreSQL cluster with a task_instance table; the output says so.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

need_apt() {
  if [ "$(id -u)" != 0 ]; then
    echo "missing $*; install it (apt-get install $*)" >&2
    exit 1
  fi
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
command -v wrk >/dev/null || need_apt wrk
command -v python3 >/dev/null || need_apt python3
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt postgresql

if [ -z "${ASTRO_SENTINEL_BIN:-}" ]; then
  (cd "$repo" && cargo build --release -p astro-sentinel >&2)
  target="${CARGO_TARGET_DIR:-$repo/target}"
  case "$target" in /*) ;; *) target="$repo/$target" ;; esac
  ASTRO_SENTINEL_BIN="$target/release/astro-sentinel"
fi
export ASTRO_SENTINEL_BIN

exec python3 "$here/bench.py"
