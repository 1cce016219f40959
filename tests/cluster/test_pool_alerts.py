"""The pool alerts on the real control plane: a real Prometheus scrapes the real Sentinel (through
its Service, as the chart's ServiceMonitor would) and evaluates the chart's alerting rules, as
helm renders them into the PrometheusRule with short `thresholds`. Only the Sentinel is scraped:
these alerts must not need the workers' series, which vanish with a pool's last pod.

1. At zero: a KEDA pool held at 0 by `autoscaling.keda.sh/paused-replicas: "0"` gets tasks.
   Paused on purpose: the Sentinel exports `astro_sentinel_pool_paused` 1 (read from KEDA's own
   annotation on the real ScaledObject) and its history finds "Paused for …", and
   AstroAgentPoolStuckAtZero stays silent although its bare condition holds longer than its
   `for`, while AstroAgentTasksQueuedTooLong fires (the wait is real). Then the ScaledObject is
   deleted: the Deployment stays at 0 with nothing scaling it, not paused, and
   AstroAgentPoolStuckAtZero fires. Once the release restores the ScaledObject unpaused, KEDA
   wakes the pool, both alerts resolve and the tasks run.
2. No room: a pool whose pods need 1.5 CPUs (one per 2-CPU node; the namespace's own two) is driven to its maximum of 4;
   two pods stay unschedulable and AstroAgentPodsUnschedulable fires for it, with their count, and
   AstroAgentPoolAtMaximum, since tasks stay queued while the pool is at its maximum.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from harness.procs import wait_for
from harness.prometheus_server import PrometheusServer

from conftest import chart_values, dedicated_nodes
from infra.helm_release import render_chart

NAMESPACE = "astro-alerts"
RELEASE = "alerts"
ZERO = "astro-worker-zero"
BIG = "astro-worker-big"
SENTINEL_TARGET = f"astro-sentinel.{NAMESPACE}.svc:39092"
SENTINEL = f"http://{SENTINEL_TARGET}"
THRESHOLD = "10s"
QUEUED_TOO_LONG_SECONDS = 5
PAUSED = {"autoscaling.keda.sh/paused-replicas": "0"}


def _values(airflow, paused: bool) -> dict:
    keda = {"enabled": True, "minReplicaCount": 0, "pollingInterval": 2, "cooldownPeriod": 20}
    values = chart_values(airflow)
    values["workers"] = [
        {"name": "zero", "queues": ["cluster-at-zero"], "syncSlots": 2,
         "keda": {**keda, "maxReplicaCount": 2, "annotations": PAUSED if paused else {}}},
        {"name": "big", "queues": ["cluster-alerts-big"], "syncSlots": 3,
         "resources": {"requests": {"cpu": "1500m", "memory": "512Mi"}},
         "keda": {**keda, "maxReplicaCount": 4}, **dedicated_nodes(NAMESPACE)},
    ]
    return values


def _rules(values: dict, folder: Path) -> Path:
    """The PrometheusRule the chart renders for `values` with short thresholds, as a rules file."""
    values_file = folder / "values.json"
    values_file.write_text(json.dumps(values))
    docs = render_chart(RELEASE, NAMESPACE, [values_file], sets=[
        "monitoring.prometheusRule.enabled=true",
        f"monitoring.prometheusRule.thresholds.poolStuckAtZeroFor={THRESHOLD}",
        f"monitoring.prometheusRule.thresholds.podsUnschedulableFor={THRESHOLD}",
        f"monitoring.prometheusRule.thresholds.poolAtMaximumFor={THRESHOLD}",
        f"monitoring.prometheusRule.thresholds.queuedTooLongSeconds={QUEUED_TOO_LONG_SECONDS}",
        f"monitoring.prometheusRule.thresholds.queuedTooLongFor={THRESHOLD}",
    ])
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    path = folder / "rules.json"
    path.write_text(json.dumps({"groups": rule["spec"]["groups"]}))
    return path


@pytest.fixture(scope="module")
def pools(cluster, nodes, keda, airflow, release_factory, tmp_path_factory):
    """The release (zero paused at 0, big at 0) and a Prometheus scraping its Sentinel only."""
    release = release_factory(RELEASE, NAMESPACE)
    values = _values(airflow, paused=True)
    release.install(values)
    folder = tmp_path_factory.mktemp("pool-alerts")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(_rules(values, folder))],
        "scrape_configs": [{
            "job_name": "astro-sentinel",
            "static_configs": [{"targets": [SENTINEL_TARGET], "labels": {"namespace": NAMESPACE}}],
        }],
    }
    with PrometheusServer(config, folder=folder / "prometheus") as prom:
        for worker in (ZERO, BIG):
            wait_for(lambda: _value(prom, f'astro_sentinel_worker_replicas{{worker="{worker}"}}') == 0, 180,
                     f"the Sentinel to export {worker} at 0 replicas",
                     on_timeout=lambda: json.dumps(prom.targets())[:2000])
        yield release, prom


def _history_with(token: str, deployment: str, kind: str) -> dict | None:
    """The worker's 15-minute history once it holds a finding of ``kind``."""
    response = requests.get(f"{SENTINEL}/v1/workers/{deployment}/history", params={"range": "15m"},
                            headers={"Authorization": f"Bearer {token}"}, timeout=5)
    if response.status_code != 200:
        return None
    history = response.json()
    return history if any(f["kind"] == kind for f in history["findings"]) else None


def _value(prom: PrometheusServer, expr: str) -> float | None:
    found = prom.query(expr)
    return float(found[0]["value"][1]) if found else None


def _firing(prom: PrometheusServer, alert: str, worker: str) -> list[dict]:
    return prom.query(f'ALERTS{{alertname="{alert}",alertstate="firing",worker="{worker}"}}')


def _all_fired(prom: PrometheusServer, alerts: list[str], worker: str, timeout: float) -> dict[str, dict]:
    """Waits until each of `alerts` has been seen firing for `worker` (not necessarily at once: one
    may resolve before another fires); the first firing sample of each, by alert name."""
    seen: dict[str, dict] = {}

    def all_seen() -> bool:
        for alert in alerts:
            if alert not in seen and (found := _firing(prom, alert, worker)):
                (seen[alert],) = found
        return len(seen) == len(alerts)

    wait_for(all_seen, timeout, f"{', '.join(alerts)} to fire for {worker}",
             on_timeout=lambda: f"fired: {sorted(seen)}; " + json.dumps(prom.rule_groups())[:4000])
    return seen


def test_pool_stuck_at_zero_fires_from_the_sentinel_alone(cluster, airflow, pools):
    release, prom = pools
    alerts = ["AstroAgentPoolStuckAtZero", "AstroAgentTasksQueuedTooLong"]
    for alert in alerts:
        assert not _firing(prom, alert, ZERO), f"no backlog yet: {alert} must be silent"

    dag = "cluster_at_zero"
    airflow.client.ensure_runnable(dag)
    run_id = airflow.client.trigger(dag)
    triggered = time.monotonic()
    wait_for(lambda: (_value(prom, f'astro_sentinel_worker_backlog{{worker="{ZERO}"}}') or 0) > 0, 120,
             "the Sentinel to see the queued tasks")
    # Paused on purpose: the wait is reported, the pool is not "stuck".
    assert _value(prom, f'astro_sentinel_pool_paused{{worker="{ZERO}"}}') == 1
    (queued_too_long,) = _all_fired(prom, ["AstroAgentTasksQueuedTooLong"], ZERO, 120).values()
    stuck_condition = (f'astro_sentinel_worker_backlog{{worker="{ZERO}"}} > 0 '
                       f'and astro_sentinel_worker_replicas{{worker="{ZERO}"}} == 0')
    # The bare condition held for longer than the alert's `for` (10 s), sampled every second.
    wait_for(lambda: (_value(prom, f"count_over_time(({stuck_condition})[15s:1s])") or 0) >= 15, 60,
             "the stuck-at-zero condition to hold 15 s")
    assert not prom.query(f'ALERTS{{alertname="AstroAgentPoolStuckAtZero",worker="{ZERO}"}}'), \
        "paused on purpose: neither pending nor firing"
    token = cluster.secret_value(NAMESPACE, "astro-keda-sentinel-token", "token")
    history = wait_for(lambda: _history_with(token, ZERO, "paused"), 60, "the history's paused finding")
    paused = next(f for f in history["findings"] if f["kind"] == "paused")
    assert paused["text"].startswith("Paused for ") and history["tiles"]["pausedSeconds"] >= 10, history["tiles"]
    assert history["tiles"]["atMaximumSeconds"] == 0 and all(p["paused"] for p in history["series"][-3:])

    # Nothing scales the Deployment any more (the ScaledObject is gone): stuck, not paused.
    cluster.custom.delete_namespaced_custom_object("keda.sh", "v1alpha1", NAMESPACE, "scaledobjects", ZERO)
    wait_for(lambda: _value(prom, f'astro_sentinel_pool_paused{{worker="{ZERO}"}}') == 0, 60,
             "the Sentinel to see the pause gone with its ScaledObject")
    unpaused_at_zero = time.monotonic()
    (stuck,) = _all_fired(prom, ["AstroAgentPoolStuckAtZero"], ZERO, 120).values()
    both_fired = time.monotonic()
    fired = {"AstroAgentPoolStuckAtZero": stuck, "AstroAgentTasksQueuedTooLong": queued_too_long}
    assert fired["AstroAgentPoolStuckAtZero"]["metric"]["severity"] == "critical"
    assert fired["AstroAgentTasksQueuedTooLong"]["metric"]["severity"] == "warning"
    assert {a["metric"]["namespace"] for a in fired.values()} == {NAMESPACE}
    assert (_value(prom, f'astro_sentinel_worker_oldest_queued_age_seconds{{worker="{ZERO}"}}') or 0) \
        > QUEUED_TOO_LONG_SECONDS
    assert cluster.deployment(NAMESPACE, ZERO).spec.replicas == 0
    print(f"\nAstroAgentPoolStuckAtZero fired {both_fired - unpaused_at_zero:.1f} s after the pause ended "
          f"with the ScaledObject")

    # The release restores the ScaledObject, unpaused: the pool wakes, the alert resolves, the tasks run.
    release.upgrade(_values(airflow, paused=False))
    unpaused = time.monotonic()
    wait_for(lambda: (_value(prom, f'astro_sentinel_worker_replicas{{worker="{ZERO}"}}') or 0) >= 1, 120,
             "KEDA to wake the pool")
    for alert in alerts:
        wait_for(lambda: not _firing(prom, alert, ZERO), 60, f"{alert} to resolve")
    print(f"\nAstroAgentPoolStuckAtZero (for: {THRESHOLD}) and AstroAgentTasksQueuedTooLong "
          f"(> {QUEUED_TOO_LONG_SECONDS} s for {THRESHOLD}) had both fired {both_fired - triggered:.1f} s after the "
          f"trigger; both resolved {time.monotonic() - unpaused:.1f} s after the pause was lifted")
    assert airflow.client.wait_run(dag, run_id, timeout=300) == "success"


def test_pods_unschedulable_and_pool_at_maximum_fire(cluster, airflow, pools):
    _, prom = pools
    alerts = ["AstroAgentPodsUnschedulable", "AstroAgentPoolAtMaximum"]
    for alert in alerts:
        assert not _firing(prom, alert, BIG)

    dag = "cluster_alerts_capacity"
    airflow.client.ensure_runnable(dag)
    run_id = airflow.client.trigger(dag)
    fired = _all_fired(prom, alerts, BIG, 240)
    assert fired["AstroAgentPodsUnschedulable"]["metric"]["state"] == "waiting"
    assert fired["AstroAgentPoolAtMaximum"]["metric"]["severity"] == "warning"
    assert _value(prom, f'astro_sentinel_worker_max_replicas{{worker="{BIG}"}}') == 4
    # The Sentinel's count is the scheduler's: pods whose PodScheduled is False/Unschedulable.
    def unschedulable() -> int:
        pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector=f"deploymentName={BIG}").items
        return sum(1 for p in pods if p.metadata.deletion_timestamp is None and any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in p.status.conditions or []))

    def both() -> tuple[float, int] | None:
        seen = _value(prom, f'astro_sentinel_worker_pods{{worker="{BIG}",state="waiting"}}'), unschedulable()
        return seen if seen[0] == seen[1] else None

    waiting, _ = wait_for(both, 30, "the Sentinel's waiting count to equal the API's unschedulable pods",
                          on_timeout=lambda: str((_value(prom, f'astro_sentinel_worker_pods{{worker="{BIG}"}}'),
                                                  unschedulable())))
    print(f"\nAstroAgentPodsUnschedulable and AstroAgentPoolAtMaximum fired for {BIG}: {waiting:.0f} pods waiting, "
          f"{cluster.deployment(NAMESPACE, BIG).spec.replicas} replicas")
    assert waiting >= 1
    assert airflow.client.wait_run(dag, run_id, timeout=300) == "success"
    for alert in alerts:
        wait_for(lambda: not _firing(prom, alert, BIG), 180, f"{alert} to resolve once the pool has scaled in")
