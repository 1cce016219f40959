"""The external-push trigger on the real control plane: a pool at 0 replicas whose ScaledObject
polls only every 300 s wakes within seconds of a task being queued, because the Sentinel pushes
"active" to KEDA's operator over the gRPC stream (mutual TLS with the chart-made certificates)
at the refresh that first sees the task; the task then runs in the woken pod.
"""

from __future__ import annotations

import time
from datetime import datetime

from harness.procs import wait_for

from conftest import chart_values

NAMESPACE = "astro-push"
RELEASE = "push"
DEPLOYMENT = "astro-worker-push"
SENTINEL = "astro-sentinel"
DAG = "cluster_push"
POLLING_INTERVAL = 300


def _queued_at(airflow, run_id: str) -> datetime | None:
    (ti,) = airflow.client.task_instances(DAG, run_id)
    value = ti.get("queued_when")
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _keda_story(cluster, keda) -> str:
    return (f"ScaledObject status: {cluster.scaled_object(NAMESPACE, DEPLOYMENT).get('status')}\n"
            f"KEDA operator on it:\n{keda.operator_lines(DEPLOYMENT)}")


def test_a_queued_task_wakes_a_pool_at_zero_through_the_push(cluster, nodes, keda, airflow, release_factory):
    release = release_factory(RELEASE, NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = [{
        "name": "push", "queues": ["cluster-push"], "syncSlots": 1,
        "keda": {"enabled": True, "trigger": "external-push", "minReplicaCount": 0, "maxReplicaCount": 1,
                 "pollingInterval": POLLING_INTERVAL, "cooldownPeriod": 10},
    }]
    installed = time.monotonic()
    release.install(values)
    wait_for(lambda: (cluster.deployment(NAMESPACE, SENTINEL).status.ready_replicas or 0) == 1, 180,
             f"{SENTINEL} ready")
    sentinel_ready = time.monotonic() - installed
    # Until KEDA's operator reaches the Sentinel it cannot make the HPA (GetMetricSpec fails), and
    # it retries on its controller's per-object backoff, which doubles from 5 ms with every failure:
    # the HPA appears at the first retry after the Sentinel is reachable, up to about twice as long
    # after the install as that took (here usually 12-15 s; gRPC's own re-resolving of the name adds
    # to it), and the same reconcile starts the scale loop, whose first act is to scale the
    # Deployment to 0. The wait is for those two, not for the ScaledObject's Ready condition: KEDA's
    # scale loop patches the conditions from its own older copy of the object, which can put Ready
    # back to Unknown after the reconcile set it True (seen once: HPA made and Deployment at 0 at
    # once, Ready still Unknown 300 s later, no error logged), and nothing reconciles it again.
    wait_for(lambda: cluster.hpa(NAMESPACE, f"keda-hpa-{DEPLOYMENT}") is not None, 300,
             f"keda-hpa-{DEPLOYMENT}", on_timeout=lambda: _keda_story(cluster, keda))
    hpa_made = time.monotonic() - installed
    print(f"\nSentinel ready {sentinel_ready:.1f}s and KEDA's HPA made {hpa_made:.1f}s after the install")
    if hpa_made > 60:  # far slower than usual: put KEDA's side on record
        print(_keda_story(cluster, keda))
    wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 0, 120, f"{DEPLOYMENT} at 0")

    airflow.client.ensure_runnable(DAG)
    run_id = airflow.client.trigger(DAG)
    queued = wait_for(lambda: _queued_at(airflow, run_id), 120, "the task queued")
    wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 1, 60,
             f"{DEPLOYMENT} at 1 replica",
             on_timeout=lambda: f"ScaledObject status: {cluster.scaled_object(NAMESPACE, DEPLOYMENT).get('status')}")
    woken = time.time()
    latency = woken - queued.timestamp()
    print(f"\nqueued_dttm → Deployment replicas 1 in {latency:.2f}s (pollingInterval {POLLING_INTERVAL}s)")
    # KEDA polled when the ScaledObject became ready and polls next POLLING_INTERVAL later: a
    # wake-up well within it came from the push.
    assert latency < 30, f"replicas 1 only {latency:.1f}s after the task was queued"
    assert airflow.client.wait_run(DAG, run_id, timeout=300) == "success"
