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
# every scenario shares) run afterwards, one after another, on the same infrastructure.
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
export ASTRO_CLUSTER_PROCESSES="${ASTRO_CLUSTER_PROCESSES:-2}"
unshare --net --mount --propagation private -- bash -c '
  set -euo pipefail
  ip link set lo up
  ip addr add 10.200.0.1/32 dev lo
  sysctl -qw net.ipv4.ip_forward=1
  : > "$ASTRO_CLUSTER_WORK/hosts"
  mount --bind "$ASTRO_CLUSTER_WORK/hosts" /etc/hosts
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
  # Exit code 5: pytest selected no test (the files asked for have none of that kind).
  selected() { "$@" || { code=$?; [ "$code" -eq 5 ] || exit "$code"; }; }
  selected "$python" -m pytest -n "$ASTRO_CLUSTER_PROCESSES" --dist loadfile --no-loadscope-reorder \
    --durations=30 -m "not alone" "$@"
  # The chaos scenarios that stop what every scenario shares (the API server, KEDA) come last,
  # alone, one after another, on the same infrastructure.
  selected "$python" -m pytest --durations=30 -m alone "$@"
' cluster-stage "$root" "$tools/bin/python" -p no:cacheprovider -v -rA "${@:-tests/cluster}"
