#!/usr/bin/env bash
# The project's test command (the README's second command; CI runs it via .ci/run).
#
#   tests/run.sh [STAGE]...      (default: every stage, in this order)
#
# Installs what is missing, then runs the stages, stopping at the first failure, and ends with a
# table of each stage's wall time. The stages (their list is `stages` below):
#   rust    cargo fmt --check, clippy -D warnings, rustdoc -D warnings, unit + in-process tests,
#           a bounded fuzzing run (the property tests that feed the parsers arbitrary input, with
#           more cases), the release build every later stage runs
#   chart   the Helm chart against a real helm (built from the Go module proxy) and the
#           Kubernetes / KEDA / prometheus-operator schemas
#   e2e     the agent and the Sentinel against a real Airflow 3 on PostgreSQL, Prometheus
#   compat  the compatibility matrix (tests/compat/run.sh): the agent and the Sentinel against
#           older Airflow 3 minors. Named on its own (`tests/run.sh compat`) it runs every pair;
#           in a run of every stage, the oldest pair (the newest is the e2e stage's own)
#   keda    KEDA's own scaler code and validation against the chart and a live Sentinel
#   demo    the demo in its short mode, the local scaler's rules, README reference vs --help
#   docker  the Sentinel and agent images built FROM scratch with podman; a worker pod (agent
#           and a tasks container from an Airflow image without astro-agent) against a real
#           Airflow 3, whose tasks hunt for the agent's secrets
#   cluster the chart, agent and Sentinel on a real Kubernetes control plane with KEDA's
#           operator, Prometheus and prometheus-adapter (only the kubelet is stood in for)
# An unknown stage name exits 2 and lists the valid ones.
#
# What the later stages download is fetched in the background while the Rust stage compiles
# (tests/lib/prefetch.sh), and the cluster stage's Go builds run beside the stages.
# Slow things are cached under ${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}, keyed by
# version; without the cache the same run only takes longer.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

stages=(rust chart e2e compat keda demo docker cluster)

chosen=("$@")
compat_pairs=()
[ ${#chosen[@]} -gt 0 ] || { chosen=("${stages[@]}"); compat_pairs=(3.0); }
for name in "${chosen[@]}"; do
  case " ${stages[*]} " in
    *" $name "*) ;;
    *) echo "tests/run.sh: unknown stage '$name'; the stages are: ${stages[*]}" >&2; exit 2 ;;
  esac
done
want() { case " ${chosen[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
step() { printf '\n==> %s\n' "$*"; }
# pytest in the cached tools venv
pytest() { "$(bash tests/lib/venvs.sh tools)/bin/python" -m pytest -p no:cacheprovider -v "$@"; }

. tests/lib/cache.sh
. tests/lib/cargo-target.sh

# ---- the wall-time table, printed however the run ends ----------------------------------------
run_start=$SECONDS
timed_names=()
timed_seconds=()
current_stage=
current_start=
minutes() { printf '%dm %02ds' $(($1 / 60)) $(($1 % 60)); }
print_times() {
  local i
  [ -z "$current_stage" ] || { timed_names+=("$current_stage (failed)"); timed_seconds+=($((SECONDS - current_start))); }
  printf '\n==> wall time per stage (%s cores, load %s)\n' "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
  for i in "${!timed_names[@]}"; do
    printf '  %-22s %s\n' "${timed_names[$i]}" "$(minutes "${timed_seconds[$i]}")"
  done
  printf '  %-22s %s\n' total "$(minutes $((SECONDS - run_start)))"
}
# timed NAME COMMAND...: runs COMMAND and records its wall time under NAME.
timed() {
  current_stage="$1"
  current_start=$SECONDS
  shift
  "$@"
  timed_names+=("$current_stage")
  timed_seconds+=($((SECONDS - current_start)))
  current_stage=
}

# ---- work in the background -------------------------------------------------------------------
# in_background LOG COMMAND...: starts COMMAND in a session of its own (stopped as one process
# group on the way out), its output to LOG, and leaves its PID in $background_pid.
# On purpose not niced: the kernel's autogroups (sched_autogroup_enabled) share the CPU equally
# between sessions whatever their processes' nice values, so each background session gets as
# much CPU as the stages. Measured on a fresh machine: with each session's autogroup niced to
# 19, the Rust stage took 21.5 min instead of 32.5, but the Go builds it starved then ran under
# the e2e stage (12.8 min instead of 8.9) and held the KEDA stage (19.3 min instead of 3.8, its
# Go test binary alone 977 s): more than the gain. All that work needs the CPU; what pays is less.
background_pid=
in_background() {
  local log="$1"
  shift
  setsid "$@" >"$log" 2>&1 &
  background_pid=$!
}

# ---- the cluster stage's Go builds, in the background -----------------------------------------
# The control plane, KEDA, Prometheus and prometheus-adapter (about 25 min of CPU when nothing is
# cached) start now, in their own session (see in_background): they share the CPU with the Rust
# stage and take what the later stages leave idle (sleeping tasks, waiting daemons), and are done
# or nearly so when the cluster stage, the last, needs them.
cluster_build_pid=
cluster_build_log=
compat_venvs_pid=
compat_venvs_log=
prefetch_pid=
prefetch_log=
on_exit() {
  print_times
  [ -z "$cluster_build_pid" ] || kill -- -"$cluster_build_pid" 2>/dev/null || true
  [ -z "$cluster_build_log" ] || rm -f "$cluster_build_log"
  [ -z "$compat_venvs_pid" ] || kill -- -"$compat_venvs_pid" 2>/dev/null || true
  [ -z "$compat_venvs_log" ] || rm -f "$compat_venvs_log"
  [ -z "$prefetch_pid" ] || kill -- -"$prefetch_pid" 2>/dev/null || true
  [ -z "$prefetch_log" ] || rm -f "$prefetch_log"
}
trap on_exit EXIT

timed prerequisites bash tests/lib/prerequisites.sh go curl
if want cluster; then
  cluster_build_log="$(mktemp)"
  in_background "$cluster_build_log" bash tests/cluster/build.sh
  cluster_build_pid=$background_pid
fi
# What the stages after the Rust one download (Debian's packages, venvs, Go modules, helm),
# fetched while the Rust stage compiles; every later stage first waits for it (await_prefetch).
prefetch_start=$SECONDS
prefetch_log="$(mktemp)"
in_background "$prefetch_log" bash tests/lib/prefetch.sh "${chosen[@]}"
prefetch_pid=$background_pid
await_prefetch() {
  [ -n "$prefetch_pid" ] || return 0
  local status=0 waited=$SECONDS
  wait "$prefetch_pid" || status=$?
  prefetch_pid=
  cat "$prefetch_log"
  echo "prefetch: done $((SECONDS - prefetch_start)) s after the start; waited $((SECONDS - waited)) s for it"
  [ "$status" -eq 0 ] || { echo "fetching ahead failed (exit $status)" >&2; return 1; }
}
# The compatibility matrix's venvs (downloads, a minute or two each when not cached), likewise.
if want compat; then
  compat_venvs_log="$(mktemp)"
  in_background "$compat_venvs_log" bash tests/compat/run.sh --venvs "${compat_pairs[@]}"
  compat_venvs_pid=$background_pid
fi

# The binaries every later stage tests (none of them skips for want of a build).
export ASTRO_AGENT_BIN="$ASTRO_RELEASE_DIR/astro-agent"
export ASTRO_SENTINEL_BIN="$ASTRO_RELEASE_DIR/astro-sentinel"

# ---- the stages -------------------------------------------------------------------------------
stage_rust() {
  step "cargo fmt --check"
  cargo fmt --all -- --check
  step "cargo clippy"
  cargo clippy --workspace --all-targets --release -- -D warnings
  step "cargo doc (rustdoc warnings are errors)"
  # --release: it reuses the dependencies clippy just checked.
  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --release
  step "cargo test"
  cargo test --workspace --release
  # The Sentinel's config parser, the Edge API answer decoder and the launcher's frames get
  # arbitrary input: 256 cases per property above, this many here (10-25 s in all on
  # 2 cores). A failure prints the minimal input; it becomes a named test.
  step "fuzz (property tests, PROPTEST_CASES=${ASTRO_FUZZ_CASES:-50000})"
  PROPTEST_CASES="${ASTRO_FUZZ_CASES:-50000}" cargo test --workspace --release fuzz_
  # The tests built these very binaries (one feature set for both, Cargo.toml says why): a
  # build that compiles anything again fails here, naming what it compiled.
  step "cargo build --workspace --release (the tests' binaries: nothing to compile)"
  local log
  log="$(mktemp)"
  cargo_release_build 2>&1 | tee "$log"
  if grep -q '^ *Compiling' "$log"; then
    echo "the release build compiled again what the tests built:" >&2
    grep '^ *Compiling' "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
stage_chart() {
  step "chart tests"
  bash tests/chart/run.sh
}
stage_e2e() {
  step "end-to-end tests against a real Airflow"
  # Three tests at a time (mostly they wait on tasks and polls), sharing one Airflow stack;
  # tests/e2e/conftest.py says which run one after another.
  pytest -n 3 tests/e2e
}
stage_compat() {
  step "compatibility matrix: ${compat_pairs[*]:-every pair}"
  local status=0
  wait "$compat_venvs_pid" || status=$?
  compat_venvs_pid=
  cat "$compat_venvs_log"
  [ "$status" -eq 0 ] || { echo "building the compatibility matrix's venvs failed (exit $status)" >&2; return 1; }
  bash tests/compat/run.sh "${compat_pairs[@]}"
}
stage_keda() {
  step "KEDA contract (KEDA's own code against the chart and a live Sentinel)"
  bash tests/keda/run.sh
}
stage_demo() {
  step "demo (short mode), scaler rules, README reference vs --help"
  pytest tests/demo
}
stage_docker() {
  step "container images (podman: Sentinel and agent FROM scratch; the worker pod against a real Airflow)"
  pytest tests/docker
}
stage_cluster() {
  step "cluster: the chart on a real control plane with KEDA, Prometheus and prometheus-adapter"
  local build_status=0 waited=$SECONDS
  wait "$cluster_build_pid" || build_status=$?
  cluster_build_pid=
  cat "$cluster_build_log"
  echo "waited $((SECONDS - waited)) s for the cluster builds"
  [ "$build_status" -eq 0 ] || { echo "the cluster stage's builds failed (exit $build_status)" >&2; return 1; }
  bash tests/cluster/run.sh
}

if ! want rust; then
  timed "release build" cargo_release_build # a no-op when up to date
fi
for name in "${stages[@]}"; do
  want "$name" || continue
  [ "$name" = rust ] || [ -z "$prefetch_pid" ] || timed "prefetch (waited)" await_prefetch
  timed "$name" "stage_$name"
done
