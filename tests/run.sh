#!/usr/bin/env bash
# The project's test command (the README's second command; CI runs it via .ci/run).
#
# Installs what is missing, then runs, stopping at the first failure:
#   rust   cargo fmt --check, clippy -D warnings, unit + in-process tests, a bounded fuzzing
#          run (the property tests that feed the parsers arbitrary input, with more cases),
#          release build
#   chart  the Helm chart against a real helm (built from the Go module proxy) and the
#          Kubernetes / KEDA / prometheus-operator schemas
#   e2e    the agent and the Sentinel against a real Airflow 3 on PostgreSQL, Prometheus
#   keda   KEDA's own scaler code and validation against the chart and a live Sentinel
#   demo   the demo in its short mode, the local scaler's rules, README reference vs --help
#   docker the Sentinel image built FROM scratch with podman; the agent Dockerfile's checks
#   cluster the chart, agent and Sentinel on a real Kubernetes control plane with KEDA's
#          operator, Prometheus and prometheus-adapter (only the kubelet is stood in for)
# Choose stages with arguments: tests/run.sh [rust] [chart] [e2e] [keda] [demo] [docker]
# [cluster] (default: all).
#
# Slow things are cached under ${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}, keyed by
# version; without the cache the same run only takes longer.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
. tests/lib/cache.sh
. tests/lib/cargo-target.sh

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(rust chart e2e keda demo docker cluster)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
step() { printf '\n==> %s\n' "$*"; }
# pytest in the cached tools venv
pytest() { "$(bash tests/lib/venvs.sh tools)/bin/python" -m pytest -p no:cacheprovider -v "$@"; }

bash tests/lib/prerequisites.sh go curl

# The cluster stage's Go builds (control plane, KEDA, Prometheus, prometheus-adapter: about
# 25 min of CPU when nothing is cached) start now, niced, in their own process group: they take
# what CPU the other stages leave idle (sleeping tasks, waiting daemons) and are done or nearly
# so when the cluster stage, the last, needs them.
cluster_build_pid=
if want cluster; then
  cluster_build_log="$(mktemp)"
  setsid nice -n 19 bash tests/cluster/build.sh >"$cluster_build_log" 2>&1 &
  cluster_build_pid=$!
  trap '[ -z "$cluster_build_pid" ] || kill -- -"$cluster_build_pid" 2>/dev/null; rm -f "$cluster_build_log"' EXIT
fi

# The binaries every later stage tests (none of them skips for want of a build).
export ASTRO_AGENT_BIN="$CARGO_TARGET_DIR/release/astro-agent"
export ASTRO_SENTINEL_BIN="$CARGO_TARGET_DIR/release/astro-sentinel"

if want rust; then
  step "cargo fmt --check"
  cargo fmt --all -- --check
  step "cargo clippy"
  cargo clippy --workspace --all-targets --release -- -D warnings
  step "cargo test"
  cargo test --workspace --release
  # The Sentinel's config parser, the Edge API answer decoder and the launcher's frames get
  # arbitrary input: 256 cases per property above, this many here (10-25 s in all on
  # 2 cores). A failure prints the minimal input; it becomes a named test.
  step "fuzz (property tests, PROPTEST_CASES=${ASTRO_FUZZ_CASES:-50000})"
  PROPTEST_CASES="${ASTRO_FUZZ_CASES:-50000}" cargo test --workspace --release fuzz_
  step "cargo build --release"
  cargo build --workspace --release
else
  cargo build --workspace --release  # a no-op when up to date
fi

if want chart; then
  step "chart tests"
  bash tests/chart/run.sh
fi

if want e2e; then
  step "end-to-end tests against a real Airflow"
  # Three tests at a time (mostly they wait on tasks and polls), sharing one Airflow stack;
  # tests/e2e/conftest.py says which run one after another.
  pytest -n 3 tests/e2e
fi

if want keda; then
  step "KEDA contract (KEDA's own code against the chart and a live Sentinel)"
  bash tests/keda/run.sh
fi

if want demo; then
  step "demo (short mode), scaler rules, README reference vs --help"
  pytest tests/demo
fi

if want docker; then
  step "container images (podman: Sentinel FROM scratch; agent Dockerfile checks)"
  pytest tests/docker
fi

if want cluster; then
  step "cluster: the chart on a real control plane with KEDA, Prometheus and prometheus-adapter"
  build_status=0
  wait "$cluster_build_pid" || build_status=$?
  cluster_build_pid=
  cat "$cluster_build_log"
  [ "$build_status" -eq 0 ] || { echo "the cluster stage's builds failed (exit $build_status)" >&2; exit 1; }
  bash tests/cluster/run.sh
fi
