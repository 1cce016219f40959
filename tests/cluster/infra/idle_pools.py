"""The stage-wide check that KEDA never read a backlog above 0 for an idle queue.

A false non-zero costs a worker for a whole cooldown (300 s by default), as surely as a false
zero costs latency. So while the stage runs, :func:`start_recording` (started with KEDA by the
driver) keeps every scrape in which a ScaledObject's backlog trigger read above 0, with the
queues of the worker Deployment it scales (its agent's ``ASTRO_AGENT_QUEUES``, looked up when it
first reads above 0), one JSON line each in :func:`record_path`. At the end :func:`violations`
asks Airflow whether any task instance was ever on those queues: a reading above 0 for queues
that never had one is a false non-zero -- unless it is at most the pool's floor (its
``minReplicaCount`` times the trigger's target), which cannot take the pool above its minimum:
KEDA's fallback while it cannot read the Sentinel is exactly that for a pool with a minimum.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

from infra.keda_readings import BACKLOG_TRIGGER, KedaReadings, Reading

QUEUES_ENV = "ASTRO_AGENT_QUEUES"


def record_path(work: Path) -> Path:
    return Path(work) / "logs" / "keda-backlog-above-zero.jsonl"


def metrics_url(keda: Any) -> str:
    return f"http://{keda.address}:{keda.ports.operator_metrics}/metrics"


def deployment_queues(cluster: Any) -> Callable[[str, str], tuple[list[str], float] | None]:
    """``(namespace, scaled_object) -> (queues, floor)``: the queues of the agent in the
    Deployment it scales, and the backlog at or below which the pool stays at its minimum
    (``minReplicaCount`` × the backlog trigger's ``targetValue``); None when either object is gone
    (or the API server is away: a chaos scenario stops it)."""
    import urllib3
    from kubernetes.client.rest import ApiException

    def pool(namespace: str, scaled_object: str) -> tuple[list[str], float] | None:
        try:
            so = cluster.scaled_object(namespace, scaled_object)
            deployment = cluster.deployment(namespace, so["spec"]["scaleTargetRef"]["name"])
        except (ApiException, urllib3.exceptions.HTTPError):
            return None
        target = next((float(t["metadata"].get("targetValue", 0)) for t in so["spec"].get("triggers", [])
                       if t.get("name") == BACKLOG_TRIGGER), 0.0)
        floor = so["spec"].get("minReplicaCount", 0) * target
        for c in deployment.spec.template.spec.containers:
            for e in c.env or []:
                if e.name == QUEUES_ENV and e.value:
                    return [q.strip() for q in e.value.split(",") if q.strip()], floor
        return None

    return pool


class Recorder:
    """Writes the backlog readings above 0, each with its worker's queues (looked up again after
    ``refresh`` seconds: a release installed again under the same name may have other queues)."""

    def __init__(self, path: Path, pool_of: Callable[[str, str], tuple[list[str], float] | None],
                 refresh: float = 30.0):
        self.path, self._pool_of, self._refresh = Path(path), pool_of, refresh
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pools: dict[tuple[str, str], tuple[float, tuple[list[str], float] | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, reading: Reading) -> None:
        t = reading.trigger
        if t.name != BACKLOG_TRIGGER:
            return
        key = (t.namespace, t.scaled_object)
        with self._lock:
            looked_up, pool = self._pools.get(key, (0.0, None))
            if pool is None or time.monotonic() - looked_up > self._refresh:
                pool = self._pool_of(*key)
                self._pools[key] = (time.monotonic(), pool)
            queues, floor = pool if pool is not None else (None, 0.0)
            line = {"at": reading.at, "namespace": t.namespace, "scaledObject": t.scaled_object,
                    "value": reading.value, "queues": queues, "floor": floor}
            with self.path.open("a") as f:
                f.write(json.dumps(line) + "\n")


def start_recording(work: Path, keda: Any, cluster: Any) -> KedaReadings:
    """The sampler, started; ``.stop()`` it at the end of the stage."""
    readings = KedaReadings(metrics_url(keda), on_above_zero=Recorder(record_path(work), deployment_queues(cluster)))
    readings.start()
    return readings


def violations(work: Path, task_count: Callable[[str], int]) -> tuple[list[str], list[str]]:
    """One line per ScaledObject whose backlog read above 0 although no task instance was ever on
    its queues (``task_count(queue)``: every task instance Airflow has on the queue); and one per
    ScaledObject that read above 0 when its queues could not be known (its Deployment gone)."""
    path = record_path(work)
    if not path.exists():
        return [], []
    seen: dict[tuple[str, str, tuple[str, ...]], list[dict]] = {}
    unknown: set[tuple[str, str]] = set()
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["value"] <= r.get("floor", 0.0):
            continue  # cannot take the pool above its minimum (KEDA's fallback for it is this)
        if r["queues"] is None:
            unknown.add((r["namespace"], r["scaledObject"]))
            continue
        seen.setdefault((r["namespace"], r["scaledObject"], tuple(r["queues"])), []).append(r)
    false_non_zero = []
    for (ns, so, queues), readings in sorted(seen.items()):
        if any(task_count(q) for q in queues):
            continue
        values = sorted({r["value"] for r in readings})
        span = readings[-1]["at"] - readings[0]["at"]
        false_non_zero.append(
            f"{ns}/{so} (queues {', '.join(queues)}, on which no task was ever queued): KEDA read a backlog of "
            f"{values} in {len(readings)} scrapes over {span:.0f} s")
    undetermined = [f"{ns}/{so}: read above 0 while its Deployment was gone" for ns, so in sorted(unknown)]
    return false_non_zero, undetermined
