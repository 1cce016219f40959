"""A `helm upgrade` that changes only the worker pools keeps the Sentinel Pod and its history:
the chart no longer rolls the Sentinel for its ConfigMap, the kubelet stand-in updates the
mounted ConfigMap in place (the `..data` symlink swap), and the running Sentinel applies the new
file — the new maximum served, a new pool served, the same Pod (UID, no restart), the same
recording."""

from __future__ import annotations

import requests

from harness.procs import wait_for

from conftest import chart_values

NAMESPACE = "astro-reload"
SENTINEL = f"http://astro-sentinel.{NAMESPACE}.svc:39092"


def _workers(max_alpha: int, with_beta: bool) -> list[dict]:
    keda = {"enabled": True, "minReplicaCount": 0, "pollingInterval": 5}
    workers = [{"name": "alpha", "queues": ["cluster-reload-a"], "syncSlots": 2,
                "keda": {**keda, "maxReplicaCount": max_alpha}}]
    if with_beta:
        workers.append({"name": "beta", "queues": ["cluster-reload-b"], "syncSlots": 2,
                        "keda": {**keda, "maxReplicaCount": 2}})
    return workers


def _sentinel_pod(cluster):
    pods = cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/component=sentinel").items
    running = [p for p in pods if p.metadata.deletion_timestamp is None]
    assert len(running) == 1, [p.metadata.name for p in pods]
    return running[0]


def test_a_pool_change_keeps_the_sentinel_pod_and_its_history(cluster, nodes, keda, airflow, release_factory):
    release = release_factory("reload", NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = _workers(3, with_beta=False)
    release.install(values)
    wait_for(lambda: (cluster.deployment(NAMESPACE, "astro-sentinel").status.ready_replicas or 0) == 1,
             90, "the Sentinel pod Ready")
    token = cluster.secret_value(NAMESPACE, "astro-keda-sentinel-token", "token")
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"

    def get(path: str) -> requests.Response:
        return session.get(f"{SENTINEL}{path}", timeout=5)

    def recording_since() -> str | None:
        response = get("/v1/workers/astro-worker-alpha/history?range=15m")
        return response.json().get("recordingSince") if response.status_code == 200 else None

    since = wait_for(recording_since, 60, "the Sentinel recording alpha's history")
    pod = _sentinel_pod(cluster)
    assert get("/v1/workers/astro-worker-beta").status_code == 404

    values["workers"] = _workers(5, with_beta=True)
    release.upgrade(values)

    def alpha_max() -> int | None:
        response = get("/v1/workers/astro-worker-alpha")
        return response.json().get("maxReplicas") if response.status_code == 200 else None

    # The kubelet projects a ConfigMap change within its sync period; the Sentinel checks every 5 s.
    wait_for(lambda: alpha_max() == 5, 120, "the new maxReplicas served",
             on_timeout=lambda: f"maxReplicas {alpha_max()}")
    wait_for(lambda: get("/v1/workers/astro-worker-beta").status_code == 200, 30, "the new pool served")
    after = _sentinel_pod(cluster)
    assert after.metadata.uid == pod.metadata.uid, "the same Sentinel Pod"
    assert all((s.restart_count or 0) == 0 for s in after.status.container_statuses or [])
    assert recording_since() == since, "its history kept"
    metrics = session.get(f"{SENTINEL}/metrics", timeout=5).text
    assert "astro_sentinel_config_generation 2" in metrics.splitlines()
