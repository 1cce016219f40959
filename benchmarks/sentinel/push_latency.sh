#!/usr/bin/env bash
# Wake-up latency: Airflow's queued_dttm of a task on a worker at zero → KEDA says "active",
# for KEDA's external-push scaler (the Sentinel's gRPC stream) beside KEDA's metrics-api scaler
# polled at each interval, all seeing the same queued task, in one run. KEDA's own scaler code
# (v2.21, tests/keda/go.mod) against the real astro-sentinel over a real Airflow; the driver is
# tests/keda/test_external_push.py (test_wake_up_latency_benchmark), the loop push_test.go.
#
# Usage: benchmarks/sentinel/push_latency.sh
# Env:   TRIALS    trials (default 20)
#        POLL      metrics-api polling intervals in seconds, comma-separated (default "30,5":
#                  KEDA's and the chart's default pollingInterval, and a tightened one;
#                  empty: the push scaler alone)
#        REFRESH   the Sentinel's refreshInterval (default 1s)
#        ASTRO_SENTINEL_BIN  use this binary instead of building one
# Prints one line per trial and, per variant, p50 / p95 / max (lines starting with BENCH).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export KEDA_PUSH_BENCH_TRIALS="${TRIALS:-20}" KEDA_PUSH_BENCH_POLL="${POLL-30,5}" KEDA_PUSH_REFRESH="${REFRESH:-1s}"
exec bash "$repo/tests/keda/run.sh" "$repo/tests/keda/test_external_push.py" -k benchmark
