"""A pool paused in Airflow's maintenance, and a worker running with other slots than the
Sentinel scales by, outside Kubernetes (the Sentinel reads Airflow's list of Edge workers), for
both backlog sources.

The Sentinel's pool ``astro-worker-pause`` serves queue ``sentinel-pause`` with ``syncSlots`` 4;
one real astro-agent serves it, started with ``--sync-slots 4``.

1. As configured: ``astro_sentinel_pool_paused`` 0, ``astro_sentinel_worker_slot_drift_workers`` 0.
2. Airflow sets the worker's concurrency to 2 (its UI API, as an operator would): the agent
   runs with 2 slots and says so in its heartbeat; the gauge counts 1 drifting worker and the
   15-minute history finds "Worker agent-… ran with 2 slots while the autoscaler assumed 4 for …".
3. Maintenance requested for the worker (the pool's only one): ``astro_sentinel_pool_paused`` 1,
   and the history has paused points, a Paused tile and "Paused for …".
4. Maintenance ended: paused 0 again.
"""

from __future__ import annotations

import json

import pytest

from harness.procs import wait_for

from test_sentinel import plain_source, REFRESH, Sentinel, sentinel_bin  # noqa: F401 (a fixture)

QUEUE = "sentinel-pause"
POOL = "astro-worker-pause"
SYNC_SLOTS = 4
WORKERS = [{"name": POOL, "queues": [QUEUE], "syncSlots": SYNC_SLOTS, "minReplicas": 0, "maxReplicas": 5}]
# A finding on the 15-minute range needs 15 min × 15 min / 1 day = 9.375 s of the state.
FINDING_WAIT = 60


def gauge(s: Sentinel, series: str) -> float | None:
    """The value of exactly ``series`` (name and labels) on ``/metrics``; None when absent."""
    _, text = s.get("/metrics", token=None)
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def history(s: Sentinel) -> dict:
    status, body = s.get(f"/v1/workers/{POOL}/history?range=15m")
    assert status == 200, body
    return json.loads(body)


def finding(s: Sentinel, kind: str) -> dict | None:
    return next((f for f in history(s)["findings"] if f["kind"] == kind), None)


@pytest.mark.parametrize("source", ["airflow-api", "postgres"])
def test_maintenance_pauses_the_pool_and_other_slots_are_found(source, airflow, astro_agent, sentinel_bin,
                                                                tmp_path):
    cleanup = []
    source_config, env = plain_source(airflow, source, "task_instance, edge_worker", cleanup)
    s = Sentinel(sentinel_bin, tmp_path / "sentinel", source_config, env, workers=WORKERS)
    try:
        s.start()
        run_scenario(source, airflow, astro_agent, s)
    finally:
        s.stop()
        for step in cleanup:
            try:
                step()
            except Exception as e:  # keep cleaning up
                print(f"cleanup step failed: {e}")


def run_scenario(source, airflow, astro_agent, s: Sentinel):
    client = airflow.client
    name = f"agent-pause-{source}"
    agent = astro_agent(name, queues=[QUEUE], sync_slots=SYNC_SLOTS)
    client.wait_edge_worker(name)
    paused = f'astro_sentinel_pool_paused{{worker="{POOL}"}}'
    drift = f'astro_sentinel_worker_slot_drift_workers{{worker="{POOL}"}}'
    on_timeout = lambda: f"{client.edge_worker(name)}\n{s.daemon.tail()}"  # noqa: E731

    # 1. As configured: neither.
    wait_for(lambda: gauge(s, paused) == 0 and gauge(s, drift) == 0, 20 * REFRESH,
             "the Sentinel to see the worker online with its 4 slots", on_timeout=on_timeout)

    # 2. Airflow gives the worker 2 slots: the pool's autoscaler still assumes 4.
    client.set_worker_concurrency(name, 2)
    wait_for(lambda: agent.gauge("astro_agent_slots") == 2.0, 30, "the agent to run with 2 slots", interval=0.2)
    wait_for(lambda: gauge(s, drift) == 1, 30, "the Sentinel to count the drifting worker", on_timeout=on_timeout)
    found = wait_for(lambda: finding(s, "slotDrift"), FINDING_WAIT, "the slot drift finding",
                     on_timeout=lambda: json.dumps(history(s)["findings"]))
    print(f"{source}: {found['text']}")
    assert found["text"].startswith(f"Worker {name} ran with 2 slots while the autoscaler assumed 4 for "), found

    # 3. The pool's only online worker in maintenance: the pool is paused.
    client.request_maintenance(name)
    wait_for(lambda: gauge(s, paused) == 1, 30, "the Sentinel to see the pool paused", on_timeout=on_timeout)
    found = wait_for(lambda: finding(s, "paused"), FINDING_WAIT, "the paused finding",
                     on_timeout=lambda: json.dumps(history(s)["findings"]))
    h = history(s)
    print(f"{source}: {found['text']} (tiles {h['tiles']})")
    assert found["text"].startswith("Paused for "), found
    assert h["tiles"]["pausedSeconds"] >= 9, h["tiles"]
    assert any(p["paused"] for p in h["series"]) and not h["series"][0]["paused"], h["series"]
    assert client.edge_worker(name)["state"].startswith("maintenance"), client.edge_worker(name)

    # 4. Maintenance over: no longer paused.
    client.exit_maintenance(name)
    wait_for(lambda: gauge(s, paused) == 0, 30, "the pause to end", on_timeout=on_timeout)
