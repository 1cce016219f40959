#!/usr/bin/env bash
# Benchmark of astro-sentinel: cached GET /v1/workers/{name} throughput and p99 latency with
# static-token auth on (wrk on loopback, 200 workers over 50 queues), the Sentinel's RSS, and
# upstream requests/queries per refresh for both sources, with and without load.
#
# Usage: benchmarks/sentinel/run.sh            (from anywhere; prints the figures)
# Env:   ASTRO_SENTINEL_BIN  use this binary instead of building one into the cached target folder
#        BENCH_DURATION      seconds per wrk run (default 10), BENCH_RUNS runs (default 3; the median is judged)
#        BENCH_CONNECTIONS   wrk connections (default 16), BENCH_THREADS wrk threads (default 1)
#
# No Airflow is needed: the airflow-api source reads a tiny fake REST API (fake_airflow.py) and
# the postgres source a private PostgreSQL cluster with a task_instance table; the output says so.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
. tests/lib/prologue.sh --with=wrk astro-sentinel

exec "$python" benchmarks/sentinel/bench.py
