"""The chart's ValidatingAdmissionPolicy on the real API server: with the Sentinel's own
ServiceAccount token, patching a worker Pod's deletion-cost annotation is admitted, and any other
change -- an image, a label, another annotation, or the cost of a Pod that is not a worker -- is
refused with the policy's message, although RBAC grants `patch` on every Pod of the namespace."""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from harness.procs import wait_for

from conftest import chart_values
from infra.kube import Cluster

NAMESPACE = "astro-patch-policy"
POOL = "astro-worker-guarded"
COST = "controller.kubernetes.io/pod-deletion-cost"


@pytest.fixture(scope="module")
def as_sentinel(cluster, control_plane, nodes, keda, airflow, release_factory) -> Cluster:
    release = release_factory("guarded", NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = [{"name": "guarded", "queues": ["cluster-guarded"], "syncSlots": 1,
                          "keda": {"enabled": True, "minReplicaCount": 1, "maxReplicaCount": 1}}]
    release.install(values)
    wait_for(lambda: _pods(cluster, "component=worker"), 120, "the worker Pod")
    token = cluster.core.create_namespaced_service_account_token(
        "astro-sentinel", NAMESPACE, {"spec": {"expirationSeconds": 600}}).status.token
    as_sentinel = Cluster(control_plane.server, str(control_plane.ca_file), token)
    # The API server loads a new policy and its binding from its own watch, a moment after they
    # are created: wait until a dry run of a change the policy forbids is refused (admission
    # runs for dry runs; nothing is changed).
    (worker,) = _pods(cluster, "component=worker")
    forbidden = {"metadata": {"labels": {"component": "hijacked"}}}
    wait_for(lambda: _refused_dry_run(as_sentinel, worker.metadata.name, forbidden), 60,
             "the chart's ValidatingAdmissionPolicy in force")
    return as_sentinel


def _pods(cluster, selector: str) -> list:
    return [p for p in cluster.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]


def _refused_dry_run(client: Cluster, pod: str, patch: dict) -> bool:
    try:
        client.core.patch_namespaced_pod(pod, NAMESPACE, patch, dry_run="All")
        return False
    except ApiException as e:
        return e.status == 422


def _refusal(client: Cluster, pod: str, patch: dict) -> str:
    with pytest.raises(ApiException) as refused:
        client.core.patch_namespaced_pod(pod, NAMESPACE, patch)
    assert refused.value.status == 422, refused.value
    return refused.value.body


def test_the_sentinel_may_change_only_the_deletion_cost_of_workers(as_sentinel, cluster):
    (worker,) = _pods(cluster, "component=worker")
    name = worker.metadata.name
    as_sentinel.core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"annotations": {COST: "3"}}})
    assert cluster.core.read_namespaced_pod(name, NAMESPACE).metadata.annotations[COST] == "3"

    agent = next(c for c in worker.spec.containers if c.name == "agent")
    image = _refusal(as_sentinel, name, {"spec": {"containers": [{"name": "agent", "image": "evil/agent:1"}]}})
    assert "may not change a Pod's spec" in image, image
    label = _refusal(as_sentinel, name, {"metadata": {"labels": {"component": "hijacked"}}})
    assert "labels, owners or finalizers" in label, label
    other = _refusal(as_sentinel, name, {"metadata": {"annotations": {"example.com/extra": "x"}}})
    assert f"no annotation but {COST}" in other, other
    (sentinel,) = _pods(cluster, "component=sentinel")
    not_a_worker = _refusal(as_sentinel, sentinel.metadata.name, {"metadata": {"annotations": {COST: "1"}}})
    assert "only this release's worker Pods" in not_a_worker, not_a_worker
    after = cluster.core.read_namespaced_pod(name, NAMESPACE)
    assert next(c.image for c in after.spec.containers if c.name == "agent") == agent.image
    assert after.metadata.labels["component"] == "worker"

    # The policy holds the Sentinel only: the admin's same extra annotation is admitted.
    cluster.core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"annotations": {"example.com/extra": "x"}}})
