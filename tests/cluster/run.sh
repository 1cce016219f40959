#!/usr/bin/env bash
# The cluster stage: the chart, the agent and the Sentinel on a real Kubernetes control plane
# (kube-apiserver, kube-controller-manager, kube-scheduler, etcd), with KEDA's real operator and
# metrics API server, a real Prometheus and prometheus-adapter, against a real Airflow 3.
# Only the kubelet is stood in for (standin/: pods run as processes).
#
#   tests/cluster/run.sh [pytest args]   (default: tests/cluster; e.g. -x tests/cluster/test_install.py)
#
# Builds (cached under ${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}): the control plane, KEDA and
# prometheus-adapter (build.sh), helm (tests/chart/helm.sh), the venvs (tests/lib/venvs.sh) and,
# unless ASTRO_AGENT_BIN / ASTRO_SENTINEL_BIN name them, the two binaries.
#
# The scenarios run side by side; those marked `alone` (chaos on the API server and KEDA, which
# every scenario shares) run at the same time, one after another, on infrastructure of their own.
#
# Everything runs in a private network and mount namespace (unshare): its `lo` carries
# 10.200.0.1, where the API server and every server the cluster routes to listen (the API server
# refuses loopback addresses in Endpoints); pods get their own network namespaces, joined to it
# by veth pairs; a hosts file bind-mounted over /etc/hosts inside stands in for cluster DNS.
# Nothing listens outside the namespace, and it all disappears with it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$root/tests/lib/cache.sh"
. "$root/tests/lib/cargo-target.sh"
bash "$root/tests/lib/prerequisites.sh" go
command -v unshare >/dev/null && command -v nsenter >/dev/null && command -v ip >/dev/null \
  && command -v openssl >/dev/null || {
  [ "$(id -u)" -eq 0 ] || { echo "the cluster stage needs util-linux, iproute2 and openssl (and root)" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends util-linux iproute2 openssl >/dev/null
}
[ "$(id -u)" -eq 0 ] || { echo "the cluster stage needs root (network namespaces, mounts)" >&2; exit 1; }
# The page is checked in a headless Chromium inside the namespace, where apt cannot reach out.
command -v chromium >/dev/null && command -v chromedriver >/dev/null || {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
}

start=$SECONDS
ASTRO_CLUSTER_BIN="$(bash "$here/build.sh")"
echo "control plane binaries ready in $((SECONDS - start)) s: $ASTRO_CLUSTER_BIN"
ASTRO_HELM="$(bash "$root/tests/chart/helm.sh")"
tools="$(bash "$root/tests/lib/venvs.sh" tools)"
bash "$root/tests/lib/venvs.sh" airflow >/dev/null
# Debian's Prometheus (the pool-alert scenario evaluates the chart's rules in it), unpacked into the
# cache here: apt cannot reach out from inside the namespace either.
PYTHONPATH="$root/tests/lib" "$tools/bin/python" -c 'from harness.prometheus_server import binaries; binaries()'
if [ -z "${ASTRO_AGENT_BIN:-}" ] || [ -z "${ASTRO_SENTINEL_BIN:-}" ]; then
  (cd "$root" && cargo_release_build)
  ASTRO_AGENT_BIN="$ASTRO_RELEASE_DIR/astro-agent"
  ASTRO_SENTINEL_BIN="$ASTRO_RELEASE_DIR/astro-sentinel"
fi
export ASTRO_CLUSTER_BIN ASTRO_HELM ASTRO_AGENT_BIN ASTRO_SENTINEL_BIN

# Pods mount emptyDirs over /tmp in their own mount namespaces: keep the stage's files elsewhere.
work="$(mktemp -d /var/tmp/astro-cluster.XXXXXX)"
# Traversable by others (not listable): PostgreSQL runs as its own user below it.
chmod 0711 "$work"
trap 'rm -rf "$work"' EXIT
export ASTRO_CLUSTER_WORK="$work"

# The scenarios run side by side in ${ASTRO_CLUSTER_PROCESSES:-2} pytest processes (pytest-xdist),
# each in its own namespace and release, on infrastructure (control plane, Nodes, KEDA, Airflow)
# that infra/driver.py starts once and stops at the end; 0 runs them one after another in one
# pytest process that starts its own. Two, on two cores: with three, Airflow's api-server (one for
# every scenario) answered the workers and the Sentinels too slowly under a loaded machine.
#
# The scenarios marked `alone` (chaos on the API server and KEDA, which every scenario shares) run
# at the same time, one after another, on an instance of the infrastructure of their own, in a
# network and mount namespace of its own: they take some 7 minutes, which the side-by-side
# scenarios, mostly waiting on scaling and tasks, leave enough idle CPU for (after them, on the
# same infrastructure, the stage lasted that much longer). Its output follows the others'.
export ASTRO_CLUSTER_PROCESSES="${ASTRO_CLUSTER_PROCESSES:-2}"
# instance NAME PYTEST_ARGS...: one instance of the stage in a private network and mount
# namespace, its files under $work/NAME.
instance() {
  local name="$1"
  shift
  mkdir -m 0711 "$work/$name"
  ASTRO_CLUSTER_WORK="$work/$name" unshare --net --mount --propagation private -- bash -c '
  set -euo pipefail
  ip link set lo up
  ip addr add 10.200.0.1/32 dev lo
  sysctl -qw net.ipv4.ip_forward=1
  : > "$ASTRO_CLUSTER_WORK/hosts"
  mount --bind "$ASTRO_CLUSTER_WORK/hosts" /etc/hosts
  # The Pods'"'"' named network namespaces: this instance'"'"'s own (the other instance names its
  # Nodes, and so its sandboxes, alike).
  mkdir -p /run/netns
  mount -t tmpfs -o mode=0755 netns /run/netns
  export TMPDIR="$ASTRO_CLUSTER_WORK"
  cd "$1"; python="$2"; shift 2
  if [ "$ASTRO_CLUSTER_PROCESSES" -eq 0 ]; then
    exec "$python" -m pytest "$@"
  fi
  export ASTRO_CLUSTER_STATE="$ASTRO_CLUSTER_WORK/shared.json"
  log="$ASTRO_CLUSTER_WORK/logs/shared-infrastructure.log"
  mkdir -p "$(dirname "$log")"
  started=$SECONDS
  # The driver prints "ready" once everything is up, and closes its stdout: EOF without it means
  # it failed (and stopped what it had started).
  exec 3< <(PYTHONPATH="$PWD/tests/lib:$PWD/tests/cluster" exec "$python" -m infra.driver \
              --state "$ASTRO_CLUSTER_STATE" 2>"$log")
  driver=$!
  trap "kill -TERM $driver 2>/dev/null; wait $driver || true; tail -n 3 \"$log\"" EXIT
  ready=""
  read -r ready <&3 || true
  exec 3<&-
  if [ "$ready" != ready ]; then
    echo "the shared infrastructure did not start; the end of $log:" >&2
    tail -n 80 "$log" >&2
    exit 1
  fi
  echo "shared infrastructure ready in $((SECONDS - started)) s"
  "$python" -m pytest "$@"
' cluster-stage "$root" "$tools/bin/python" -p no:cacheprovider -v -rA "$@"
}
# selects MARKER_EXPRESSION: whether the scenarios asked for hold any of that kind (pytest's exit
# code 5: none); a collection error ends the stage.
selects() {
  local code=0
  (cd "$root" && "$tools/bin/python" -m pytest -p no:cacheprovider --collect-only -q -m "$1" \
    "${scenarios[@]}" >"$work/collected" 2>&1) || code=$?
  case "$code" in
    0) return 0 ;;
    5) return 1 ;;
    *) cat "$work/collected" >&2; echo "collecting the scenarios failed (exit $code)" >&2; exit "$code" ;;
  esac
}
scenarios=("${@:-tests/cluster}")
if [ "$ASTRO_CLUSTER_PROCESSES" -eq 0 ]; then
  instance all "${scenarios[@]}"
  exit
fi
alone_pid=
alone_out="$work/alone.out"
stop_alone() {
  [ -z "$alone_pid" ] || { kill -TERM -- -"$alone_pid" 2>/dev/null; wait "$alone_pid" || true; }
  rm -rf "$work"
}
trap stop_alone EXIT
if selects alone; then
  export root tools work
  setsid bash -c "$(declare -f instance); instance alone --durations=30 -m alone \"\$@\"" \
    alone-instance "${scenarios[@]}" >"$alone_out" 2>&1 &
  alone_pid=$!
fi
status=0
if selects "not alone"; then
  instance shared -n "$ASTRO_CLUSTER_PROCESSES" --dist loadfile --no-loadscope-reorder --durations=30 \
    -m "not alone" "${scenarios[@]}" || status=$?
fi
if [ -n "$alone_pid" ]; then
  alone_status=0
  wait "$alone_pid" || alone_status=$?
  alone_pid=
  printf '\n==> the scenarios marked alone, on an instance of their own\n'
  cat "$alone_out"
  [ "$alone_status" -eq 0 ] || status=$alone_status
fi
exit "$status"
