#!/usr/bin/env bash
# Builds the cluster stage's control plane from the Go module proxy and prints one folder
# holding every binary: kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes,
# pinned in kube/go.mod), etcd (etcd/go.mod), KEDA's operator and metrics API server
# (build-keda.sh), prometheus-adapter (build-adapter.sh), and Prometheus and promtool with
# Kubernetes service discovery (build-prometheus.sh).
#
# Each component is cached under $ASTRO_CACHE_DIR/cluster/<name>-<key>, the key covering its
# module files, the Go version and the flags: a second run builds nothing. All Go builds share
# one module and build cache with the KEDA contract stage. Build times go to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$root/tests/lib/cache.sh"
. "$here/go-env.sh"

# The version the binaries report: helm's kubeVersion checks and KEDA's version checks read it,
# and an unstamped build says v0.0.0-master.
kube_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/kube/go.mod")"
kube_minor="$(echo "$kube_version" | cut -d. -f2)"
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor -X k8s.io/component-base/version.gitTreeState=clean"

kube="$(go_build_cached kube "$here/kube" "$kube_ldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler)"
etcd="$(go_build_cached etcd "$here/etcd" "-s -w" .)"
keda="$(bash "$here/build-keda.sh")"
adapter="$(bash "$here/build-adapter.sh")"
prometheus="$(bash "$here/build-prometheus.sh")"

# One folder of links, keyed by what it links to.
key="$(printf '%s\n' "$kube" "$etcd" "$keda" "$adapter" "$prometheus" | sha256sum | cut -c1-12)"
bin="$ASTRO_CACHE_DIR/cluster/bin-$key"
if [ ! -d "$bin" ]; then
  tmp="$(mktemp -d "$ASTRO_CACHE_DIR/cluster/.bin.XXXXXX")"
  for dir in "$kube" "$etcd" "$keda" "$adapter" "$prometheus"; do
    for f in "$dir"/*; do ln -s "$f" "$tmp/"; done
  done
  mv -T "$tmp" "$bin"
fi
echo "$bin"
