"""Idle workers leave first. A KEDA pool held at 3 workers (min = max = 3) runs one long task,
so one pod is busy and two are idle. The Sentinel keeps each pod's
`controller.kubernetes.io/pod-deletion-cost` equal to the task slots it runs; when an upgrade
lowers the pool to 2, the real ReplicaSet controller deletes an idle pod, and the busy one
keeps running its task to success. The same run with `sentinel.kubernetes.idleFirstScaleIn:
false` reports which pod Kubernetes chose on its own (its rules ignore work: newest first)."""

from __future__ import annotations

from harness.procs import wait_for

from conftest import chart_values
from infra.kube import PodRecorder

NAMESPACE = "astro-idle"
DEPLOYMENT = "astro-worker-idle"
DAG = "cluster_idle_first"
COST = "controller.kubernetes.io/pod-deletion-cost"


def _values(airflow, replicas: int, idle_first: bool) -> dict:
    values = chart_values(airflow)
    values["sentinel"]["kubernetes"] = {"enabled": True, "idleFirstScaleIn": idle_first}
    values["workers"] = [{
        "name": "idle", "queues": ["cluster-idle-first"], "syncSlots": 1,
        "terminationGracePeriodSeconds": 115, "drainMarginSeconds": 35,
        "keda": {"enabled": True, "minReplicaCount": replicas, "maxReplicaCount": replicas,
                 "pollingInterval": 2, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}},
    }]
    return values


def _ready_pods(cluster) -> list:
    pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector=f"deploymentName={DEPLOYMENT}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]


def _scale_in_with_one_busy(cluster, airflow, release, idle_first: bool) -> tuple[str, str, list, dict]:
    """Three Ready workers, one running the DAG's task, then the pool lowered to 2. Returns the
    busy pod, the pod Kubernetes deleted, the task instances and the costs seen before."""
    wait_for(lambda: len(_ready_pods(cluster)) == 3 and cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 3,
             180, "three Ready workers")
    recorder = PodRecorder(cluster, NAMESPACE, f"deploymentName={DEPLOYMENT}")
    recorder.start()
    try:
        airflow.client.ensure_runnable(DAG)
        run_id = airflow.client.trigger(DAG)

        def busy_pod() -> str | None:
            (ti,) = airflow.client.task_instances(DAG, run_id)
            return ti["hostname"] if ti["state"] == "running" and ti["hostname"] else None

        busy = wait_for(busy_pod, 120, "the task running on a worker")

        def costs() -> dict[str, str]:
            return {p.metadata.name: (p.metadata.annotations or {}).get(COST) for p in _ready_pods(cluster)}

        if idle_first:
            wait_for(lambda: costs().get(busy) == "1", 60, f"the Sentinel to set {busy}'s deletion cost to 1",
                     on_timeout=lambda: str(costs()))
        seen = costs()
        release.upgrade(_values(airflow, 2, idle_first))
        deleted = wait_for(lambda: next((s.name for s in recorder.snapshot().values()
                                         if s.deletion_requested_at is not None), None),
                           120, "the scale-in to delete a pod")
        state = airflow.client.wait_run(DAG, run_id, timeout=180)
        assert state == "success", f"the run ended {state}"
        tis = airflow.client.task_instances(DAG, run_id)
    finally:
        recorder.stop()
    return busy, deleted, tis, seen


def test_scale_in_deletes_an_idle_worker_and_keeps_the_busy_one(cluster, nodes, keda, airflow, release_factory):
    release = release_factory("idle", NAMESPACE)
    release.install(_values(airflow, 3, idle_first=True))

    busy, deleted, tis, costs = _scale_in_with_one_busy(cluster, airflow, release, idle_first=True)
    print(f"\nidle-first on: busy {busy}, deletion costs {costs}, deleted {deleted}")
    assert deleted != busy, f"the scale-in deleted the busy worker {busy}"
    assert costs[busy] == "1"
    assert all(costs[name] in (None, "0") for name in costs if name != busy), costs
    (ti,) = tis
    assert ti["hostname"] == busy and ti["state"] == "success"

    # The same scale-in with the feature off, from three workers again: what Kubernetes chooses.
    release.upgrade(_values(airflow, 3, idle_first=False))
    for pod in _ready_pods(cluster):  # the costs the Sentinel wrote before are not the question now
        if (pod.metadata.annotations or {}).get(COST) not in (None, "0"):
            cluster.core.patch_namespaced_pod(pod.metadata.name, NAMESPACE,
                                              {"metadata": {"annotations": {COST: None}}})
    busy, deleted, _, _ = _scale_in_with_one_busy(cluster, airflow, release, idle_first=False)
    print(f"idle-first off: busy {busy}, Kubernetes deleted {deleted} "
          f"({'the busy worker: it drained' if deleted == busy else 'an idle worker'})")
    release.uninstall()
