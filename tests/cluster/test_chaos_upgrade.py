"""Chaos: `helm upgrade` changes a busy pool's syncSlots in the middle of a burst.

A KEDA pool (syncSlots 2, 0..3 workers) runs 18 tasks of 40 s. While its three workers run tasks,
the release is upgraded to syncSlots 3: the Deployment rolls its Pods (the chart's RollingUpdate:
a new Pod first, then an old one deleted). Every replaced Pod must drain -- its agent stops
fetching, finishes the tasks it runs, reports and exits 0 inside the grace period -- and no task
fails or is lost; KEDA's HPA now divides the backlog by 3, and the pool never drops to 0 while
work waits. Prints the timeline, the replaced Pods that were busy and the task counts.
"""

from __future__ import annotations

import time

import pytest
import requests

from harness.procs import wait_for

from conftest import chart_values
from infra.drain_check import assert_drained
from infra.task_counts import assert_all_succeeded
from infra.kube import PodRecorder, ReplicaTimeline, condition

NAMESPACE = "astro-upgrade"
RELEASE = "upgrade"
SENTINEL = f"http://astro-sentinel.{NAMESPACE}.svc:39092"
POOL = "astro-worker-rolling"
DAG = "cluster_upgrade"
TASKS = 18
GRACE_SECONDS = 115


def _values(airflow, slots: int) -> dict:
    values = chart_values(airflow)
    values["workers"] = [{
        "name": "rolling", "queues": ["cluster-upgrade"], "syncSlots": slots,
        "terminationGracePeriodSeconds": GRACE_SECONDS, "drainMarginSeconds": 35,
        "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 3, "pollingInterval": 2,
                 "cooldownPeriod": 20, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}}},
    }]
    return values


@pytest.fixture(scope="module")
def upgrade(cluster, nodes, keda, airflow, release_factory):
    release = release_factory(RELEASE, NAMESPACE)
    release.install(_values(airflow, 2))
    token = cluster.secret_value(NAMESPACE, "astro-keda-sentinel-token", "token")
    wait_for(lambda: condition(cluster.scaled_object(NAMESPACE, POOL), "Ready") == "True", 120,
             f"ScaledObject {POOL} READY True")
    return {"release": release, "token": token}


def _hpa_target(cluster) -> str | None:
    hpa = cluster.hpa(NAMESPACE, f"keda-hpa-{POOL}")
    return hpa.spec.metrics[0].external.target.average_value if hpa else None


def test_a_syncslots_upgrade_rolls_busy_workers_and_each_drains(upgrade, cluster, airflow):
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {upgrade['token']}"

    def backlog() -> float | None:
        response = session.get(f"{SENTINEL}/v1/workers/{POOL}", timeout=2)
        return response.json()["backlog"] if response.status_code == 200 else None

    pods = PodRecorder(cluster, NAMESPACE, f"deploymentName={POOL}")
    timeline = ReplicaTimeline(cluster, NAMESPACE, POOL, f"keda-hpa-{POOL}", backlog, pods)
    pods.start()
    timeline.start()
    try:
        airflow.client.ensure_runnable(DAG)
        run_id = airflow.client.trigger(DAG)

        def busy_pool() -> bool:
            running = [t for t in airflow.client.task_instances(DAG, run_id) if t["state"] == "running"]
            return len(running) >= 5 and cluster.deployment(NAMESPACE, POOL).status.ready_replicas == 3

        wait_for(busy_pool, 240, "three workers running tasks")
        old_pods = {name for name, s in pods.snapshot().items() if s.ready_at and s.deleted_at is None}
        upgraded_at = time.time()
        upgrade["release"].upgrade(_values(airflow, 3))
        print(f"\nupgraded to syncSlots 3 at {upgraded_at - timeline.t0:.1f}s; old pods {sorted(old_pods)}")
        state = airflow.client.wait_run(DAG, run_id, timeout=600)
        run_end = time.time() - timeline.t0
        pods.wait_for_deletions(GRACE_SECONDS + 30)
    finally:
        timeline.stop()
        pods.stop()
        print(f"\n{POOL} timeline:\n{timeline.table()}")

    tis = airflow.client.task_instances(DAG, run_id)
    assert_all_succeeded(tis, TASKS)
    assert state == "success"

    stories = pods.snapshot()
    replaced = [stories[name] for name in old_pods]
    assert all(s.deletion_requested_at is not None for s in replaced), \
        f"old pods not replaced: {[s.name for s in replaced if s.deletion_requested_at is None]}"
    busy = assert_drained(replaced, tis, GRACE_SECONDS)
    print(f"replaced pods that were running tasks (pod, tasks, seconds to exit): {busy}")
    assert busy, "no replaced pod was running a task: the drain was not exercised"
    new_pods = {name for name, s in stories.items() if name not in old_pods and s.ready_at}
    assert new_pods and {t["hostname"] for t in tis} & new_pods, "no task ran on an upgraded worker"
    assert _hpa_target(cluster) == "3", "KEDA's HPA still divides the backlog by the old syncSlots"

    during = timeline.while_work_waited(run_end)
    assert all(s.replicas > 0 for s in during), "the pool went to 0 replicas while work waited"
