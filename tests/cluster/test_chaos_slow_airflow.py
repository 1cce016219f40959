"""Chaos: Airflow answers slowly while the pool scales in and a busy worker's drain deadline comes.

The workers reach Airflow's api-server (Edge Worker API and Execution API alike) through a proxy
that delays every answer by 3 s. A KEDA pool held at 2 workers (syncSlots 2) runs 4 tasks of 90 s;
an upgrade lowers it to 1, so a worker running two tasks is deleted with a 60 s grace period and
the chart's 35 s drain margin: at its drain deadline (25 s) the agent stops the tasks on purpose.
Everything after that goes through the slow proxy -- the tasks' final states, the jobs' reports,
the offline heartbeat -- and must land before the kubelet's SIGKILL: the agent exits 0 inside the
grace period, Airflow holds the two stopped tasks as failed (not running, waiting for orphan
detection) and the worker as offline; the other worker's tasks succeed. Prints the timeline of
the deleted Pod and the task counts (submitted / succeeded / failed on purpose / lost).
"""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlsplit

import pytest

from harness.procs import wait_for
from harness.slow_proxy import SlowProxy

from conftest import chart_values
from infra.kube import PodRecorder, condition

NAMESPACE = "astro-slow"
RELEASE = "slow"
POOL = "astro-worker-slow"
DAG = "cluster_slow_airflow"
TASKS = 4
GRACE_SECONDS = 60
DRAIN_MARGIN_SECONDS = 35
DELAY_SECONDS = 3.0


def _values(airflow, proxy: SlowProxy, replicas: int) -> dict:
    values = chart_values(airflow)
    through_proxy = f"http://{proxy.host}:{proxy.port}"
    values["airflow"]["edgeApiUrl"] = {"value": f"{through_proxy}/edge_worker/v1"}
    values["airflow"]["executionApiUrl"] = {"value": f"{through_proxy}/execution/"}
    values["workers"] = [{
        "name": "slow", "queues": ["cluster-slow-airflow"], "syncSlots": 2,
        "terminationGracePeriodSeconds": GRACE_SECONDS, "drainMarginSeconds": DRAIN_MARGIN_SECONDS,
        "keda": {"enabled": True, "minReplicaCount": replicas, "maxReplicaCount": replicas, "pollingInterval": 2,
                 "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}},
    }]
    return values


@pytest.fixture(scope="module")
def slow(cluster, nodes, keda, airflow, release_factory):
    upstream = urlsplit(airflow.api_base)
    with SlowProxy((upstream.hostname, 0), (upstream.hostname, upstream.port), DELAY_SECONDS) as proxy:
        release = release_factory(RELEASE, NAMESPACE)
        release.install(_values(airflow, proxy, 2))
        wait_for(lambda: condition(cluster.scaled_object(NAMESPACE, POOL), "Ready") == "True", 120,
                 f"ScaledObject {POOL} READY True")
        yield {"release": release, "proxy": proxy}


def _end(ti: dict) -> float:
    return datetime.fromisoformat(ti["end_date"].replace("Z", "+00:00")).timestamp()


def test_final_reports_land_before_the_sigkill_when_airflow_is_slow(slow, cluster, airflow):
    proxy = slow["proxy"]
    pods = PodRecorder(cluster, NAMESPACE, f"deploymentName={POOL}")
    pods.start()
    try:
        airflow.client.ensure_runnable(DAG)
        run_id = airflow.client.trigger(DAG)

        def all_running() -> dict[str, list[str]] | None:
            tis = airflow.client.task_instances(DAG, run_id)
            by_pod: dict[str, list[str]] = {}
            for t in tis:
                if t["state"] == "running" and t["hostname"]:
                    by_pod.setdefault(t["hostname"], []).append(t["task_id"])
            return by_pod if sum(map(len, by_pod.values())) == TASKS else None

        placement = wait_for(all_running, 240, "the 4 tasks running on the 2 workers")
        slow["release"].upgrade(_values(airflow, proxy, 1))
        deleted = wait_for(lambda: next((s for s in pods.snapshot().values() if s.deletion_requested_at), None),
                           120, "the scale-in deleting a worker")
        pods.wait_for_deletions(GRACE_SECONDS + 30)
        state = airflow.client.wait_run(DAG, run_id, timeout=300)
    finally:
        pods.stop()
    story = pods.snapshot()[deleted.name]
    drain = story.finished_at.timestamp() - story.deletion_requested_at
    stopped = set(placement.get(story.name, []))
    print(f"\nproxy: {proxy.connections} connections, {DELAY_SECONDS}s per answer; placement {placement}")
    print(f"{story.name}: deletion requested, exited {story.exit_code} after {drain:.1f}s "
          f"(drain deadline {GRACE_SECONDS - DRAIN_MARGIN_SECONDS}s, SIGKILL at {GRACE_SECONDS}s); its tasks {sorted(stopped)}")

    tis = {t["task_id"]: t for t in airflow.client.task_instances(DAG, run_id)}
    succeeded = sum(t["state"] == "success" for t in tis.values())
    failed = sum(t["state"] == "failed" for t in tis.values())
    print(f"tasks submitted {TASKS}, succeeded {succeeded}, failed on purpose {failed}, "
          f"lost {TASKS - succeeded - failed}")
    assert proxy.connections > 0, "the workers did not go through the slow proxy"
    assert len(stopped) == 2, placement
    # Everything landed before the SIGKILL: the agent exited by itself, inside the grace period...
    assert story.exit_code == 0, f"the agent exited {story.exit_code}"
    assert GRACE_SECONDS - DRAIN_MARGIN_SECONDS <= drain < GRACE_SECONDS, drain
    # ...after Airflow had the stopped tasks' final states (not left running for orphan detection)
    for task_id in stopped:
        assert tis[task_id]["state"] == "failed", tis[task_id]
        assert _end(tis[task_id]) <= story.finished_at.timestamp() + 1, tis[task_id]
    # ...the jobs' reports (the Edge executor's own record of them)...
    jobs = {j["task_id"]: j for j in airflow.client.edge_jobs(dag_id_pattern=DAG, run_id_pattern=run_id)}
    assert {t: jobs[t]["state"] for t in stopped} == {t: "failed" for t in stopped}, jobs
    # ...and the worker's offline report.
    worker = airflow.client.edge_worker(story.name)
    assert worker is not None and worker["state"] == "offline", worker
    # The other worker's tasks were not touched; nothing lost.
    assert all(tis[t]["state"] == "success" for t in tis if t not in stopped), tis
    assert (succeeded, failed) == (TASKS - 2, 2)
    assert state == "failed"  # the run holds the two tasks stopped on purpose
