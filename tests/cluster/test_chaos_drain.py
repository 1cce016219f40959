"""Chaos: a Node drained through the Eviction API, as `kubectl drain` does, while its workers run
tasks, with the chart's PodDisruptionBudget (maxUnavailable 1) in place.

A KEDA pool (syncSlots 2, up to 4 workers) on the namespace's own two Nodes runs 16 tasks of 40 s.
Once one Node holds at least two busy workers it is cordoned and its workers are evicted, each
eviction retried until the API server takes it (kubectl drain's loop). The budget must refuse a
second eviction (429) while the first Pod is not replaced; every evicted Pod drains (its running
tasks finish, the agent exits 0 inside the grace period); no task fails or is lost. Prints the
evictions, the refusals and the task counts.
"""

from __future__ import annotations

import time

import pytest
from kubernetes.client import V1DeleteOptions, V1Eviction, V1ObjectMeta
from kubernetes.client.rest import ApiException

from harness.procs import wait_for

from conftest import chart_values, dedicated_nodes
from infra.drain_check import assert_drained
from infra.task_counts import assert_all_succeeded
from infra.kube import PodRecorder, condition

NAMESPACE = "astro-drain"
RELEASE = "drain"
POOL = "astro-worker-drained"
DAG = "cluster_drain"
TASKS = 16
GRACE_SECONDS = 115


@pytest.fixture(scope="module")
def drain(cluster, nodes, keda, airflow, release_factory):
    release = release_factory(RELEASE, NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = [{
        "name": "drained", "queues": ["cluster-drain"], "syncSlots": 2,
        "terminationGracePeriodSeconds": GRACE_SECONDS, "drainMarginSeconds": 35,
        "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 4, "pollingInterval": 2,
                 "cooldownPeriod": 20, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}}},
        **dedicated_nodes(NAMESPACE),
    }]
    release.install(values)
    wait_for(lambda: condition(cluster.scaled_object(NAMESPACE, POOL), "Ready") == "True", 120,
             f"ScaledObject {POOL} READY True")
    budget = cluster.policy.read_namespaced_pod_disruption_budget(POOL, NAMESPACE)
    assert budget.spec.max_unavailable == 1
    return release


def _pool_pods_on(cluster, node: str) -> list:
    return [p for p in cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"deploymentName={POOL}", field_selector=f"spec.nodeName={node}").items
        if p.metadata.deletion_timestamp is None]


def _evict(cluster, pod: str) -> int:
    """One eviction request: 201 when the API server took it, else its refusal's status."""
    try:
        cluster.core.create_namespaced_pod_eviction(pod, NAMESPACE, V1Eviction(
            metadata=V1ObjectMeta(name=pod, namespace=NAMESPACE), delete_options=V1DeleteOptions()))
        return 201
    except ApiException as e:
        if e.status == 404:  # already gone
            return 404
        if e.status != 429:
            raise
        return 429


def test_a_node_drain_evicts_busy_workers_one_at_a_time_and_each_drains(drain, cluster, airflow):
    pods = PodRecorder(cluster, NAMESPACE, f"deploymentName={POOL}")
    pods.start()
    node = None
    evictions: list[tuple[float, str, int]] = []
    t0 = time.time()
    try:
        airflow.client.ensure_runnable(DAG)
        run_id = airflow.client.trigger(DAG)

        def node_with_two_busy() -> str | None:
            busy = {t["hostname"] for t in airflow.client.task_instances(DAG, run_id) if t["state"] == "running"}
            by_node: dict[str, int] = {}
            for story in pods.snapshot().values():
                if story.name in busy and story.node and story.deletion_requested_at is None:
                    by_node[story.node] = by_node.get(story.node, 0) + 1
            return next((n for n, count in by_node.items() if count >= 2), None)

        node = wait_for(node_with_two_busy, 240, "a Node with two busy workers")
        cluster.core.patch_node(node, {"spec": {"unschedulable": True}})
        targets = [p.metadata.name for p in _pool_pods_on(cluster, node)]
        print(f"\ncordoned {node} at {time.time() - t0:.1f}s; evicting {targets}")
        remaining = list(targets)
        while remaining:  # kubectl drain: every Pod, each retried until the API server takes it
            for pod in list(remaining):
                status = _evict(cluster, pod)
                evictions.append((time.time() - t0, pod, status))
                if status != 429:
                    remaining.remove(pod)
            if remaining:
                time.sleep(1)  # kubectl drain retries refused evictions on an interval, not an event
        wait_for(lambda: not _pool_pods_on(cluster, node), GRACE_SECONDS + 30, f"{node} empty of workers")
        state = airflow.client.wait_run(DAG, run_id, timeout=600)
        pods.wait_for_deletions(GRACE_SECONDS + 30)
    finally:
        if node is not None:
            cluster.core.patch_node(node, {"spec": {"unschedulable": False}})
        pods.stop()
        print("evictions (s, pod, status):\n" + "\n".join(f"  {t:6.1f}  {p}  {s}" for t, p, s in evictions))

    tis = airflow.client.task_instances(DAG, run_id)
    assert_all_succeeded(tis, TASKS)
    assert state == "success"

    # The budget let one Pod go at a time: a second eviction was refused while the first was down.
    assert len(targets) >= 2
    assert any(status == 429 for _, _, status in evictions), "no eviction was refused: the budget did not hold"
    stories = pods.snapshot()
    evicted = [stories[name] for name in targets]
    busy = assert_drained(evicted, tis, GRACE_SECONDS)
    print(f"evicted pods that were running tasks (pod, tasks, seconds to exit): {busy}")
    assert len(busy) >= 2, "the drain did not evict two busy workers"
    # Their replacements ran elsewhere: nothing was scheduled onto the cordoned Node afterwards.
    assert all(s.node != node for name, s in stories.items() if name not in targets and s.created
               and s.created > evictions[0][0] + t0), "a Pod was scheduled onto the cordoned Node"
