#!/usr/bin/env bash
# Usage: tests/lib/prefetch.sh STAGE...
# Fetches ahead what the named test stages would otherwise fetch when they start: Debian's
# packages, the Python venvs, Debian's Prometheus, the Go modules of the KEDA contract and the
# pinned helm. tests/run.sh starts it in the background with the Rust stage: fetching waits on
# the network, compiling on the CPU, so the two overlap. Each thing lands in the cache it always
# did (tests/lib/cache.sh), and each stage still fetches for itself what it finds missing, so a
# stage run on its own needs none of this. The one compile here (helm, from the Go module proxy)
# comes last.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
. tests/lib/cache.sh

any() {
  local stage
  for stage in "$@"; do
    case " ${chosen[*]} " in *" $stage "*) return 0 ;; esac
  done
  return 1
}
chosen=("$@")
timed() {
  local start=$SECONDS
  "$@" || return
  echo "prefetch: $* in $((SECONDS - start)) s"
}

# ---- Debian's packages, installed as the stages would (the harness installs them when missing) --
# Without their recommended packages, as the stages install them; podman with them: its pods
# need catatonit, which it only recommends.
packages=()
any e2e cluster && packages+=(chromium chromium-driver)
any e2e docker cluster && packages+=(openssl)
any cluster && packages+=(util-linux iproute2)
with_recommends=()
any docker && with_recommends+=(podman runc)
missing() {
  local package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || echo "$package"
  done
}
debian_packages() {
  local bare recommended
  bare="$(missing "${packages[@]}")"
  recommended="$(missing "${with_recommends[@]}")"
  [ -n "$bare$recommended" ] || return 0
  [ "$(id -u)" -eq 0 ] || { echo "prefetch: not root, leaving" $bare $recommended "to the stages" >&2; return 0; }
  # The harness's own apt lock (tests/lib/harness/procs.py): one apt at a time.
  (
    flock 9
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    [ -z "$bare" ] || apt-get install -y -qq --no-install-recommends $bare >/dev/null
    [ -z "$recommended" ] || apt-get install -y -qq $recommended >/dev/null
  ) 9>"$ASTRO_CACHE_DIR/apt.lock"
}

# ---- in parallel: apt, the venvs, Go modules; each one's output to its own log --------------
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
pids=()
names=()
spawn() {
  local name="$1"
  shift
  (timed "$@") >"$logs/$name" 2>&1 &
  pids+=($!)
  names+=("$name")
}
[ $((${#packages[@]} + ${#with_recommends[@]})) -eq 0 ] || spawn debian debian_packages
any e2e compat keda demo docker cluster && spawn venv-tools bash tests/lib/venvs.sh tools
any e2e compat demo docker keda cluster && spawn venv-airflow bash tests/lib/venvs.sh airflow
any chart && spawn venv-chart bash tests/lib/venvs.sh chart
if any keda; then
  keda_modules() {
    local gover
    gover="$(go env GOVERSION)"
    (cd tests/keda && GOMODCACHE="$ASTRO_CACHE_DIR/go/$gover/mod" GOFLAGS=-mod=mod GOTOOLCHAIN=local \
      go mod download)
  }
  spawn go-keda keda_modules
fi

failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    failed=1
    echo "prefetch: ${names[$i]} failed:" >&2
  fi
  cat "$logs/${names[$i]}"
done
[ "$failed" -eq 0 ] || exit 1

# Debian's Prometheus (e2e, cluster), unpacked into the cache by the harness, after the venvs it
# runs in.
if any e2e cluster; then
  prometheus() {
    PYTHONPATH="$root/tests/lib" "$(bash tests/lib/venvs.sh tools)/bin/python" \
      -c 'from harness.prometheus_server import binaries; binaries()'
  }
  timed prometheus
fi
# helm from the Go module proxy; its log only when it fails.
if any chart keda cluster; then
  timed bash tests/chart/helm.sh >/dev/null 2>"$logs/helm" || { cat "$logs/helm" >&2; exit 1; }
fi
