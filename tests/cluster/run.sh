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
# The scenarios run in two groups, each in a private network and mount namespace of its own
# (unshare; in_namespace below) with infrastructure of its own: the others side by side in
# parallel pytest processes, then those marked `alone` (chaos on the API server and KEDA, which
# every scenario of a group shares) one after another. Pods get their own network namespaces,
# joined to their group's by veth pairs. Nothing listens outside the namespaces, and it all
# disappears with them.
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

# in_namespace WORK COMMAND...: runs COMMAND (exec'd, so its PID is the caller's) in a private
# network and mount namespace of its own: its `lo` carries 10.200.0.1, where the API server and
# every server the cluster routes to listen (the API server refuses loopback addresses in
# Endpoints); a hosts file bind-mounted over /etc/hosts stands in for cluster DNS; /run/netns, where
# the stand-in keeps its Pods' network namespaces, is a tmpfs of its own. Nothing listens outside
# the namespace, and it all disappears with it.
in_namespace() {
  local dir="$1"
  shift
  mkdir -p "$dir"
  chmod 0711 "$dir"
  ASTRO_CLUSTER_WORK="$dir" exec unshare --net --mount --propagation private -- bash -c '
    set -euo pipefail
    ip link set lo up
    ip addr add 10.200.0.1/32 dev lo
    sysctl -qw net.ipv4.ip_forward=1
    : > "$ASTRO_CLUSTER_WORK/hosts"
    mount --bind "$ASTRO_CLUSTER_WORK/hosts" /etc/hosts
    mkdir -p /run/netns
    mount -t tmpfs -o mode=0755 pod-netns /run/netns
    export TMPDIR="$ASTRO_CLUSTER_WORK"
    exec "$@"' in-namespace "$@"
}

pytest_args=(-p no:cacheprovider -v -rA "${@:-tests/cluster}")
cd "$root"
# ASTRO_CLUSTER_PROCESSES=0: every scenario one after another in one pytest process, which starts
# its own infrastructure.
export ASTRO_CLUSTER_PROCESSES="${ASTRO_CLUSTER_PROCESSES:-2}"
if [ "$ASTRO_CLUSTER_PROCESSES" -eq 0 ]; then
  (in_namespace "$work/all" "$tools/bin/python" -m pytest "${pytest_args[@]}")
  exit
fi
# Otherwise two groups of scenarios, one after the other, each in a namespace of its own with
# infrastructure (control plane, Nodes, KEDA, Airflow) of its own (group.sh says how): the
# scenarios not marked `alone` in ${ASTRO_CLUSTER_PROCESSES} pytest processes (pytest-xdist), then
# those marked `alone` (chaos on the API server and KEDA, which every scenario of a group shares).
# Two processes, and the groups one after the other, on two cores: with three and the chaos group
# beside them, a warm run took 13 min instead of 22 (machine busy 91%), but a run after a fresh
# machine's builds went to a load average of 30 and a scenario failed.
status=0
(in_namespace "$work/shared" bash "$here/group.sh" shared "$tools/bin/python" "${pytest_args[@]}") || status=$?
alone_status=0
(in_namespace "$work/alone" bash "$here/group.sh" alone "$tools/bin/python" "${pytest_args[@]}") || alone_status=$?
# pytest's 5: the files asked for hold no scenario of that group.
for code in "$status" "$alone_status"; do
  [ "$code" -eq 0 ] || [ "$code" -eq 5 ] || exit "$code"
done
