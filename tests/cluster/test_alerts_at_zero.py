"""Alerts that work at zero, on the real control plane: a real Prometheus scrapes the real
Sentinel (through its Service, as the chart's ServiceMonitor would) and evaluates the chart's
alerting rules, rendered by helm as the PrometheusRule with short `thresholds`.

A KEDA pool held at 0 by `autoscaling.keda.sh/paused-replicas: "0"` (KEDA not acting) gets tasks.
It has no pod, hence no astro_agent_* series at all: only the Sentinel's series show the work
waiting. AstroAgentPoolStuckAtZero must fire for it; once the pause is lifted, KEDA wakes the
pool, the tasks run and the alert resolves.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from conftest import chart_values
from hpa_stack import render_chart
from procs import wait_for
from prometheus_server import PrometheusServer

NAMESPACE = "astro-alerts"
RELEASE = "alerts"
DEPLOYMENT = "astro-worker-zero"
DAG = "cluster_at_zero"
SENTINEL_TARGET = f"astro-sentinel.{NAMESPACE}.svc:39092"
STUCK_FOR = "10s"
PAUSED = {"autoscaling.keda.sh/paused-replicas": "0"}


def _values(airflow, paused: bool) -> dict:
    values = chart_values(airflow)
    values["workers"] = [{
        "name": "zero", "queues": ["cluster-at-zero"], "syncSlots": 2,
        "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 2, "pollingInterval": 2,
                 "cooldownPeriod": 20, "annotations": PAUSED if paused else {}},
    }]
    return values


def _rules(values: dict, folder: Path) -> Path:
    """The PrometheusRule the chart renders for `values` with short thresholds, as a rules file."""
    values_file = folder / "values.json"
    values_file.write_text(json.dumps(values))
    docs = render_chart(RELEASE, NAMESPACE, [values_file], sets=[
        "monitoring.prometheusRule.enabled=true",
        f"monitoring.prometheusRule.thresholds.poolStuckAtZeroFor={STUCK_FOR}",
    ])
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    path = folder / "rules.json"
    path.write_text(json.dumps({"groups": rule["spec"]["groups"]}))
    return path


def _firing(prom: PrometheusServer) -> list[dict]:
    return prom.query(f'ALERTS{{alertname="AstroAgentPoolStuckAtZero",alertstate="firing",worker="{DEPLOYMENT}"}}')


def test_pool_stuck_at_zero_fires_from_the_sentinel_alone(cluster, nodes, keda, airflow, release_factory):
    release = release_factory(RELEASE, NAMESPACE)
    release.install(_values(airflow, paused=True))
    folder = Path(tempfile.mkdtemp(prefix="astro-cluster-alerts-"))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(_rules(_values(airflow, paused=True), folder))],
        "scrape_configs": [{
            "job_name": "astro-sentinel",
            "static_configs": [{"targets": [SENTINEL_TARGET], "labels": {"namespace": NAMESPACE}}],
        }],
    }
    with PrometheusServer(config, folder=folder / "prometheus") as prom:
        def replicas(value: int):
            found = prom.query(f'astro_sentinel_worker_replicas{{worker="{DEPLOYMENT}"}}')
            return found if found and float(found[0]["value"][1]) == value else None

        wait_for(lambda: replicas(0), 180, "the Sentinel to export the paused pool at 0 replicas",
                 on_timeout=lambda: json.dumps(prom.targets())[:2000])
        assert not _firing(prom), "no backlog yet: the alert must be silent"

        airflow.client.ensure_runnable(DAG)
        run_id = airflow.client.trigger(DAG)
        triggered = time.monotonic()
        wait_for(lambda: prom.query(f'astro_sentinel_worker_backlog{{worker="{DEPLOYMENT}"}} > 0'), 120,
                 "the Sentinel to see the queued tasks")
        (alert,) = wait_for(lambda: _firing(prom), 120, "AstroAgentPoolStuckAtZero to fire",
                            on_timeout=lambda: json.dumps(prom.rule_groups())[:4000])
        fired = time.monotonic()
        assert alert["metric"]["severity"] == "critical"
        assert alert["metric"]["namespace"] == NAMESPACE
        assert cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 0

        # KEDA acts again: the pool wakes, the tasks run, the alert resolves.
        release.upgrade(_values(airflow, paused=False))
        unpaused = time.monotonic()
        wait_for(lambda: replicas(1) or replicas(2), 120, "KEDA to wake the pool")
        wait_for(lambda: not _firing(prom), 60, "AstroAgentPoolStuckAtZero to resolve")
        print(f"\nAstroAgentPoolStuckAtZero (for: {STUCK_FOR}) fired {fired - triggered:.1f} s after the trigger; "
              f"resolved {time.monotonic() - unpaused:.1f} s after the pause was lifted")
        assert airflow.client.wait_run(DAG, run_id, timeout=300) == "success"
