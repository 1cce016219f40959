#!/usr/bin/env bash
# Benchmark: astro-sentinel's memory when the workers' namespace also holds thousands of Pods
# that are not workers (Airflow's own, KubernetesPodOperator's), with and without the chart's
# kubernetes.workerLabels, against a real kube-apiserver and etcd (see watch_memory.py).
#
# Usage: benchmarks/sentinel/watch_memory.sh     (as root: it makes a private network namespace)
# Env:   BENCH_UNRELATED_PODS             unrelated Pods to create (default 5000)
#        ASTRO_SENTINEL_BIN               use this binary instead of building one
#        ASTRO_SENTINEL_BASELINE_BIN      also measure this build (e.g. one from an older commit)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
. tests/lib/prologue.sh astro-sentinel
ASTRO_CLUSTER_BIN="$(bash tests/cluster/build.sh)"
export ASTRO_CLUSTER_BIN
# The API server advertises 10.200.0.1 (it refuses loopback): give it that address on the `lo`
# of a namespace of its own, which disappears with everything in it.
exec unshare --net -- bash -c 'ip link set lo up && ip addr add 10.200.0.1/32 dev lo && exec "$0" "$1"' \
  "$python" benchmarks/sentinel/watch_memory.py
