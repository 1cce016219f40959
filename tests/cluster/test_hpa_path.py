"""Scenario 4: the HPA path (no KEDA). A worker with `hpa.enabled` (min 1): a real Prometheus
discovers its pods through this API server and scrapes `astro_agent_client_queue_stats`;
prometheus-adapter serves the chart's metric through custom.metrics.k8s.io with the chart's
rule; the real HPA controller scales the Deployment 1 → N → 1 on a burst."""

from __future__ import annotations

import time

import pytest

from harness.procs import wait_for

from conftest import WORK, BIN, chart_values
from infra.hpa_stack import HpaMetricsStack
from infra.kube import PodRecorder, ReplicaTimeline

NAMESPACE = "astro-hpa"
DEPLOYMENT = "astro-worker-hpa"
HPA = "astro-worker-hpa"
METRIC = "astro_agent_client_queued_or_running_tasks"
SYNC_SLOTS = 2


@pytest.fixture(scope="module")
def metrics_stack(control_plane):
    stack = HpaMetricsStack(WORK / "hpa-stack", BIN, control_plane, NAMESPACE, release="hpa")
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
            "enabled": True, "minReplicaCount": 1, "maxReplicaCount": 3,
            # Up fast, down after a short window: the chart's 300 s scale-down window and
            # 2 pods a minute would make the run several minutes longer.
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]},
                "scaleDown": {"stabilizationWindowSeconds": 10},
            },
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
