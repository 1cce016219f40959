"""Chaos: the Sentinel goes away in the middle of a burst, first deleted (the Deployment makes a new
Pod), then SIGKILLed (the kubelet restarts its container after the crash back-off).

A KEDA pool (syncSlots 2, 0..3 workers) runs 30 tasks of 20 s. While its three workers are busy
and work still waits, the Sentinel's Pod is deleted; once the new Pod serves, its container is
killed with SIGKILL. Each time KEDA cannot read the backlog: it must neither scale on the failed
reads nor to zero, and the HPA keeps the pool's size (the chart renders no fallback for a pool
whose minimum is 0): never 0 replicas while work waits, no task failed or lost. The history lives on a PersistentVolumeClaim (bound by
kube-controller-manager to a hostPath volume): what it held before the first outage must be there
after the second. Prints the timeline (the backlog column is empty while the Sentinel is away) and
the counts of tasks submitted / succeeded / failed / lost.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import requests

from harness.procs import wait_for

from conftest import WORK, chart_values
from infra.task_counts import assert_all_succeeded
from infra.kube import PodRecorder, ReplicaTimeline, condition

NAMESPACE = "astro-chaos"
RELEASE = "chaos"
SENTINEL = f"http://astro-sentinel.{NAMESPACE}.svc:39092"
POOL = "astro-worker-steady"
QUEUE = "cluster-chaos-sentinel"
DAG = "cluster_chaos_sentinel"
TASKS = 30
STORAGE_CLASS = "astro-chaos-history"  # no provisioner: the test's own PersistentVolume serves it
SENTINEL_PODS = "app.kubernetes.io/component=sentinel"

# Passed on its own and failed once among the parallel scenarios (cause not yet read): it runs in
# the quiet phase after them until that is understood.
pytestmark = pytest.mark.alone


@pytest.fixture(scope="module")
def chaos(cluster, nodes, keda, airflow, release_factory):
    volume = f"{NAMESPACE}-history"
    cluster.core.create_persistent_volume({
        "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": STORAGE_CLASS, "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": str(WORK / volume)}},
    })
    release = release_factory(RELEASE, NAMESPACE)
    values = chart_values(airflow)
    values["sentinel"]["history"] = {
        "persistence": {"mode": "pvc", "storageClassName": STORAGE_CLASS, "size": "16Mi"}}
    values["workers"] = [{
        "name": "steady", "queues": [QUEUE], "syncSlots": 2,
        "terminationGracePeriodSeconds": 115, "drainMarginSeconds": 35,
        "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 3, "pollingInterval": 2,
                 "cooldownPeriod": 20, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}}},
    }]
    try:
        release.install(values)
        token = cluster.secret_value(NAMESPACE, "astro-keda-sentinel-token", "token")
        wait_for(lambda: condition(cluster.scaled_object(NAMESPACE, POOL), "Ready") == "True", 120,
                 f"ScaledObject {POOL} READY True")
        yield {"token": token}
    finally:
        cluster.core.delete_persistent_volume(volume)  # kept by its protection until the claim goes


class _Reader:
    """The Sentinel through its Service, as KEDA reads it (None while it does not answer)."""

    def __init__(self, token: str):
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, path: str, **params) -> dict | None:
        try:
            response = self.session.get(f"{SENTINEL}{path}", params=params, timeout=2)
        except requests.RequestException:
            return None
        return response.json() if response.status_code == 200 else None

    def backlog(self) -> float | None:
        answer = self.get(f"/v1/workers/{POOL}")
        return None if answer is None else answer["backlog"]


class _TriggerErrorWatch(threading.Thread):
    """Samples the ScaledObject's Ready condition once a second: KEDA says False, reason
    TriggerError, while it cannot read the Sentinel."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.seen, self._halt = cluster, False, threading.Event()

    def run(self) -> None:
        while not self._halt.wait(1.0):
            try:
                ready = next((c for c in self.cluster.scaled_object(NAMESPACE, POOL)["status"].get("conditions", [])
                              if c["type"] == "Ready"), {})
                self.seen |= ready.get("status") == "False" and ready.get("reason") == "TriggerError"
            except Exception:  # noqa: BLE001 - one missed sample
                pass

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def _sentinel_pod(cluster):
    """The one live Sentinel Pod once it is Ready."""
    pods = [p for p in cluster.core.list_namespaced_pod(NAMESPACE, label_selector=SENTINEL_PODS).items
            if p.metadata.deletion_timestamp is None]
    ready = [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
    return ready[0] if len(pods) == 1 and ready else None


def _outage(reader: _Reader, what: str) -> tuple[float, float]:
    """Waits for the Sentinel to stop answering and then to answer again; returns both moments."""
    gone = wait_for(lambda: time.time() if reader.backlog() is None else None, 60, f"the Sentinel gone ({what})",
                    interval=0.1)
    back = wait_for(lambda: time.time() if reader.backlog() is not None else None, 180,
                    f"the Sentinel answering again after {what}", interval=0.5)
    return gone, back


def test_the_pool_survives_the_sentinel_deleted_and_killed_mid_burst(chaos, cluster, airflow):
    reader = _Reader(chaos["token"])
    pods = PodRecorder(cluster, NAMESPACE, f"deploymentName={POOL}")
    timeline = ReplicaTimeline(cluster, NAMESPACE, POOL, f"keda-hpa-{POOL}", reader.backlog, pods)
    trigger_errors = _TriggerErrorWatch(cluster)
    for thread in (pods, timeline, trigger_errors):
        thread.start()
    events: list[tuple[float, str]] = []

    def mark(what: str, at: float | None = None) -> None:
        events.append(((at or time.time()) - timeline.t0, what))

    try:
        airflow.client.ensure_runnable(DAG)
        run_id = airflow.client.trigger(DAG)
        mark("burst triggered")

        def busy_pool() -> bool:
            running = [t for t in airflow.client.task_instances(DAG, run_id) if t["state"] == "running"]
            return len(running) >= 4 and cluster.deployment(NAMESPACE, POOL).status.ready_replicas == 3

        wait_for(busy_pool, 240, "three workers running tasks")

        def with_finished_points() -> dict | None:
            """The history once points with the burst's tasks are complete (not the last two,
            which may still be filling)."""
            history = reader.get(f"/v1/workers/{POOL}/history", range="15m")
            return history if history and any(p["runningTasks"] for p in history["series"][:-2]) else None

        before = wait_for(with_finished_points, 90, "history points with the burst's tasks")
        assert before["recordingSince"], before

        # 1. The Pod deleted (its grace period: the Sentinel saves its history and stops).
        old = _sentinel_pod(cluster)
        cluster.core.delete_namespaced_pod(old.metadata.name, NAMESPACE)
        mark(f"Sentinel Pod {old.metadata.name} deleted")
        gone, back = _outage(reader, "the Pod's deletion")
        mark("Sentinel unreachable", gone)
        mark("Sentinel answering (new Pod)", back)
        waiting = [t for t in airflow.client.task_instances(DAG, run_id) if t["state"] in ("scheduled", "queued")]
        assert waiting, "the burst ended before the second outage: nothing left to wait"

        # 2. The new Pod's container SIGKILLed: no save, the kubelet restarts it.
        new = wait_for(lambda: _sentinel_pod(cluster), 60, "the new Sentinel Pod Ready")
        assert new.metadata.name != old.metadata.name
        (status,) = new.status.container_statuses
        os.kill(int(status.container_id.removeprefix("standin://")), signal.SIGKILL)
        mark(f"Sentinel container of {new.metadata.name} SIGKILLed")
        gone, back = _outage(reader, "SIGKILL")
        mark("Sentinel unreachable", gone)
        mark("Sentinel answering (restarted container)", back)

        state = airflow.client.wait_run(DAG, run_id, timeout=600)
        mark(f"run {state}")
    finally:
        for thread in (timeline, pods, trigger_errors):
            thread.stop()
        print(f"\n{POOL} timeline:\n{timeline.table()}\nevents:\n"
              + "\n".join(f"  {t:6.1f}s  {what}" for t, what in events))

    tis = airflow.client.task_instances(DAG, run_id)
    assert_all_succeeded(tis, TASKS)
    assert state == "success"

    # KEDA felt the outage (its reads failed) and neither scaled on it nor to zero; the HPA kept
    # the pool: from its first worker to the run's end, never 0 replicas.
    assert trigger_errors.seen, "KEDA's ScaledObject never said TriggerError: the outage was not felt"
    run_end = next(t for t, what in events if what.startswith("run "))
    during = timeline.while_work_waited(run_end)
    assert all(s.replicas > 0 for s in during), "the pool went to 0 replicas while work waited"
    assert any(s.backlog is None for s in during), "the timeline never sampled an outage"
    restarted = {p.metadata.name: p.status.container_statuses[0].restart_count
                 for p in cluster.core.list_namespaced_pod(NAMESPACE, label_selector=SENTINEL_PODS).items}
    assert restarted == {new.metadata.name: 1}, restarted

    # The history outlived both: same recording, and what was recorded before the deletion is
    # still served (the SIGKILL loses at most what came after the last save).
    after = reader.get(f"/v1/workers/{POOL}/history", range="15m")
    assert after is not None and after["recordingSince"] == before["recordingSince"], (before, after)
    kept = {p["t"]: p for p in after["series"]}
    earlier = [p for p in before["series"][:-2] if p["runningTasks"]]
    assert all(p["t"] in kept and kept[p["t"]]["runningTasks"] == p["runningTasks"] for p in earlier), \
        "points recorded before the deletion are gone or changed"
