"""Scenario 4: the HPA path (no KEDA). A worker with `hpa.enabled` (min 1): a real Prometheus
discovers its pods through this API server and scrapes `astro_agent_client_queue_stats`;
prometheus-adapter serves the chart's metric through custom.metrics.k8s.io with the chart's
rule; the real HPA controller scales the Deployment 1 → N → 1 on a burst. And pre-warm on that
path: the Sentinel's expected slots, scraped by the same Prometheus (the chart's Sentinel
ServiceMonitor) and served by the adapter's second rule, raise the pool before a scheduled run."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from harness.procs import wait_for

from conftest import WORK, BIN, chart_values
from infra.hpa_stack import HpaMetricsStack
from infra.kube import PodRecorder, ReplicaTimeline, ScaleRecorder

NAMESPACE = "astro-hpa"
DEPLOYMENT = "astro-worker-hpa"
HPA = "astro-worker-hpa"
METRIC = "astro_agent_client_queued_or_running_tasks"
EXPECTED_SLOTS = "astro_sentinel_worker_expected_slots"
PRE_WARM_DAG = "cluster_prewarm_hpa"
PRE_WARM_LEAD_S = 30
SENTINEL_URL = f"http://astro-sentinel.{NAMESPACE}.svc:39092"
SYNC_SLOTS = 2
# Up fast, down after a short window: the chart's 300 s scale-down window and 2 pods a minute
# would make the scenarios several minutes longer.
QUICK_BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]},
    "scaleDown": {"stabilizationWindowSeconds": 10},
}


@pytest.fixture(scope="module")
def metrics_stack(control_plane):
    # The Sentinel's ServiceMonitor too, for the pre-warm scenario (the others run no Sentinel).
    stack = HpaMetricsStack(WORK / "hpa-stack", BIN, control_plane, NAMESPACE, release="hpa",
                            sets=["sentinel.enabled=true", "serviceMonitor.sentinel.enabled=true"])
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def release(release_factory):
    """The scenarios' release, gone after each of them (also a failed one), since both are "hpa"."""
    made = release_factory("hpa", NAMESPACE)
    yield made
    if made.installed:
        made.uninstall()


def test_hpa_scales_on_the_agents_queue_stats(cluster, nodes, airflow, release, metrics_stack):
    values = chart_values(airflow)
    values["sentinel"] = {"enabled": False}
    values["workers"] = [{
        "name": "hpa", "queues": ["cluster-hpa"], "syncSlots": SYNC_SLOTS,
        "terminationGracePeriodSeconds": 115, "drainMarginSeconds": 35,
        "hpa": {
            "enabled": True, "minReplicaCount": 1, "maxReplicaCount": 3, "behavior": QUICK_BEHAVIOR,
        },
    }]
    release.install(values)
    wait_for(lambda: (cluster.deployment(NAMESPACE, DEPLOYMENT).status.ready_replicas or 0) == 1, 120,
             "the HPA pool's first worker Ready")

    # The HPA reads the metric before any work: 0 queued or running on the pool's queue.
    def metric_value() -> float | None:
        return metrics_stack.custom_metric(NAMESPACE, DEPLOYMENT, METRIC)

    wait_for(lambda: metric_value() is not None, 120, "the adapter to serve the pool's metric")

    def scaling_active() -> bool:
        hpa = cluster.hpa(NAMESPACE, HPA)
        return any(c.type == "ScalingActive" and c.status == "True" for c in (hpa.status.conditions or []))

    wait_for(scaling_active, 120, "the HPA controller reading the metric (ScalingActive)",
             on_timeout=lambda: str(cluster.hpa(NAMESPACE, HPA).status.conditions))

    pods = PodRecorder(cluster, NAMESPACE, f"deploymentName={DEPLOYMENT}")
    timeline = ReplicaTimeline(cluster, NAMESPACE, DEPLOYMENT, HPA, metric_value, pods)
    pods.start()
    timeline.start()
    try:
        airflow.client.ensure_runnable("cluster_hpa")
        run_id = airflow.client.trigger("cluster_hpa")
        wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 3, 180,
                 "the HPA to scale the pool to its maximum of 3")
        state = airflow.client.wait_run("cluster_hpa", run_id, timeout=400)
        tis = airflow.client.task_instances("cluster_hpa", run_id)
        wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 1, 180,
                 "the HPA to scale the pool back to 1")
        # The scaled-down Pods may still be draining: their exits are what is checked below.
        pods.wait_for_deletions(180)
    finally:
        timeline.stop()
        pods.stop()
        print(f"\n{DEPLOYMENT} replica timeline (metric = the adapter's value):\n{timeline.table()}")
    steps = timeline.replica_steps()
    print(f"replica steps: {steps}")
    assert state == "success"
    assert len(tis) == 12 and all(t["state"] == "success" for t in tis)
    assert steps[0] == 1 and max(steps) == 3 and steps[-1] == 1, steps
    assert {t["hostname"] for t in tis} <= set(pods.snapshot())
    for story in pods.snapshot().values():
        if story.deletion_requested_at is not None:
            assert story.exit_code == 0, f"{story.name} exited {story.exit_code} on scale-down"


def test_default_behavior_takes_the_pool_from_1_to_10_within_a_minute(cluster, nodes, airflow, release, metrics_stack):
    """The chart's default hpa.behavior.scaleUp, run by the real HPA controller: once the metric
    asks for 10 workers, the Deployment gets there in under a minute (the previous default, one
    pod per 60 s, needed 8 minutes)."""
    values = chart_values(airflow)
    values["sentinel"] = {"enabled": False}
    values["workers"] = [{
        "name": "hpa", "queues": ["cluster-hpa-fast"], "syncSlots": 1,
        # Ten small pods: they fit on the general Nodes beside other scenarios' pods.
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "hpa": {"enabled": True, "minReplicaCount": 1, "maxReplicaCount": 10},
    }]
    release.install(values)
    (hpa,) = [d for d in release.manifest() if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["behavior"]["scaleUp"]["policies"] == [
        {"type": "Percent", "value": 100, "periodSeconds": 15}, {"type": "Pods", "value": 4, "periodSeconds": 15}]
    wait_for(lambda: (cluster.deployment(NAMESPACE, DEPLOYMENT).status.ready_replicas or 0) == 1, 120,
             "the HPA pool's first worker Ready")

    def metric_value() -> float | None:
        return metrics_stack.custom_metric(NAMESPACE, DEPLOYMENT, METRIC)

    wait_for(lambda: metric_value() == 0, 120, "the adapter to serve the pool's metric at 0")

    def replicas() -> int:
        return cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas

    airflow.client.ensure_runnable("cluster_hpa_fast")
    run_id = airflow.client.trigger("cluster_hpa_fast")
    triggered = time.monotonic()
    asked = wait_for(lambda: (metric_value() or 0) >= 10 and time.monotonic(), 180,
                     "the metric to ask for 10 workers")
    steps = [1]

    def at_ten():
        n = replicas()
        if n != steps[-1]:
            steps.append(n)
        return n == 10 and time.monotonic()

    reached = wait_for(at_ten, 180, "the HPA to scale the pool to 10", on_timeout=lambda: str(steps))
    print(f"\n1 -> 10 with the default scale-up: metric >= 10 after {asked - triggered:.1f} s, "
          f"10 replicas {reached - asked:.1f} s later; steps {steps}")
    assert reached - asked < 60, steps
    assert airflow.client.wait_run("cluster_hpa_fast", run_id, timeout=400) == "success"


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_pre_warm_raises_the_hpa_pool_before_a_scheduled_run(cluster, nodes, airflow, release, metrics_stack):
    """A DAG every 100 s (three 2 s tasks, one slot each): its first run, at the unpause, teaches
    the Sentinel the run's demand (3 slots); once the pool is back at its minimum of 1, the
    HPA must raise it to 3 on the expected slots alone, before the next run is due and before any
    of its tasks is queued. Costs about three minutes."""
    values = chart_values(airflow, schedule={"readInterval": "5s"})
    values["workers"] = [{
        "name": "hpa", "queues": ["cluster-hpa-prewarm"], "syncSlots": 1,
        "preWarm": {"lead": f"{PRE_WARM_LEAD_S}s"},
        "hpa": {
            "enabled": True, "minReplicaCount": 1, "maxReplicaCount": 3, "preWarmMetric": {"enabled": True},
            "behavior": QUICK_BEHAVIOR,
        },
    }]
    release.install(values)
    wait_for(lambda: (cluster.deployment(NAMESPACE, DEPLOYMENT).status.ready_replicas or 0) == 1, 120,
             "the HPA pool's first worker Ready")
    wait_for(lambda: metrics_stack.custom_metric(NAMESPACE, DEPLOYMENT, EXPECTED_SLOTS) is not None, 120,
             "the adapter to serve the Sentinel's expected slots")

    scale = ScaleRecorder(cluster, NAMESPACE, DEPLOYMENT)
    scale.start()
    # What each side said meanwhile, for the story: the Sentinel's answer and the adapter's value.
    token = cluster.secret_value(NAMESPACE, "astro-keda-sentinel-token", "token")
    said: list[tuple[float, object, object]] = []
    halt = threading.Event()

    def sample() -> None:
        while not halt.wait(2):
            try:
                answer = requests.get(f"{SENTINEL_URL}/v1/workers/{DEPLOYMENT}", timeout=2,
                                      headers={"Authorization": f"Bearer {token}"}).json()
                expected = (answer.get("expectedSlots"), [e.get("dag") for e in answer.get("expectedFor", [])])
            except (requests.RequestException, ValueError) as e:
                expected = repr(e)
            said.append((time.time(), expected, metrics_stack.custom_metric(NAMESPACE, DEPLOYMENT, EXPECTED_SLOTS)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    client = airflow.client
    try:
        client.ensure_runnable(PRE_WARM_DAG)  # the first run starts at once

        def runs() -> list[dict]:
            return client.get(f"/api/v2/dags/{PRE_WARM_DAG}/dagRuns", order_by="run_after")["dag_runs"]

        first = wait_for(lambda: (runs() or [None])[0], 60, "the first scheduled run")
        assert client.wait_run(PRE_WARM_DAG, first["dag_run_id"], timeout=180) == "success"
        wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 1, 120,
                 "the pool back at its minimum after the first run")
        back_at_min = time.time()
        due = _epoch(client.dag(PRE_WARM_DAG)["next_dagrun_run_after"])
        assert back_at_min < due - PRE_WARM_LEAD_S, (
            f"the pool was back at 1 only {due - back_at_min:.0f}s before the next run: too late to tell pre-warm apart")
        second = wait_for(lambda: next((r for r in runs() if abs(_epoch(r["run_after"]) - due) < 1), None),
                          due - time.time() + 60, "the second scheduled run")
        assert client.wait_run(PRE_WARM_DAG, second["dag_run_id"], timeout=180) == "success"
        tis = client.task_instances(PRE_WARM_DAG, second["dag_run_id"])
    finally:
        client.request("PATCH", f"/api/v2/dags/{PRE_WARM_DAG}", json={"is_paused": True})
        scale.stop()
        halt.set()
        sampler.join()
    first_queued = min(_epoch(t["queued_when"]) for t in tis)
    first_started = min(_epoch(t["start_date"]) for t in tis)
    raised = [t for t, replicas in scale.changes if t > back_at_min and replicas == 3]
    steps = [(round(t - due, 1), replicas) for t, replicas in scale.changes]
    print(f"\nreplicas (seconds from the second run's run_after, replicas): {steps}")
    print(f"second run: first task queued {first_queued - due:+.1f}s, running {first_started - due:+.1f}s "
          f"from run_after; the pool reached 3 at {raised[0] - due:+.1f}s" if raised else "the pool never reached 3")
    story = "\n".join(f"  {t - due:+6.1f}s Sentinel {e} adapter {m}" for t, e, m in said if abs(t - due) < 45)
    print(f"the Sentinel's expected slots and the adapter's value around run_after:\n{story}")
    assert raised, f"the HPA never raised the pool to 3 after it was back at 1: {steps}"
    assert raised[0] < due and raised[0] < first_queued, (
        f"the pool reached 3 only {raised[0] - due:+.1f}s from run_after (first task queued "
        f"{first_queued - due:+.1f}s): not pre-warmed")
