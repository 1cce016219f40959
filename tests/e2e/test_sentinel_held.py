"""Task instances Airflow holds back as ``scheduled`` (here by a pool of one slot), against the
real Airflow stack, for both backlog sources.

DAG ``e2e_pool_held`` puts 4 tasks on queue ``sentinel-held`` in pool ``e2e_one_slot`` (1 slot):
Airflow queues one and holds three as scheduled. Nothing serves the queue.

* ``GET /v1/workers/{name}``: ``backlog`` 1 (only the queued one: the held ones scale nothing),
  ``heldTasks`` 3; the gauge ``astro_sentinel_worker_held_tasks`` 3.
* The 15-minute history: ``heldTasks`` 3 on its points, the Held back tile and the finding
  "Held below its maximum by Airflow for …: up to 3 tasks waited as scheduled."
"""

from __future__ import annotations

import json

import pytest

from harness.procs import wait_for

from test_sentinel import plain_source, REFRESH, Sentinel, backlog_of, sentinel_bin  # noqa: F401 (a fixture)

DAG = "e2e_pool_held"
QUEUE = "sentinel-held"
POOL = "e2e_one_slot"
WORKER = "astro-worker-held"
WORKERS = [{"name": WORKER, "queues": [QUEUE], "syncSlots": 2, "minReplicas": 0, "maxReplicas": 5}]


def history(s: Sentinel) -> dict:
    status, body = s.get(f"/v1/workers/{WORKER}/history?range=15m")
    assert status == 200, body
    return json.loads(body)


@pytest.mark.parametrize("source", ["airflow-api", "postgres"])
def test_tasks_held_by_a_pool_are_reported_and_scale_nothing(source, airflow, trigger_dag, sentinel_bin, tmp_path):
    client = airflow.client
    client.request("POST", "/api/v2/pools", ok=(200, 201, 409),
                   json={"name": POOL, "slots": 1, "description": "astro e2e: holds tasks back"})
    cleanup = []
    source_config, env = plain_source(airflow, source, "task_instance", cleanup)
    # Counted at every refresh here (30 s by default, a finding over minutes).
    s = Sentinel(sentinel_bin, tmp_path / "sentinel", source_config, env, workers=WORKERS,
                 settings={"heldTasksInterval": f"{int(REFRESH * 1000)}ms"})
    run_id = None
    try:
        s.start()
        wait_for(lambda: s.worker(WORKER)[1].get("heldTasks") == 0, 30, "nothing held on an empty queue",
                 on_timeout=lambda: f"{s.worker(WORKER)}\n{s.daemon.tail()}")
        run_id = trigger_dag(DAG)
        wait_for(lambda: client.counts_by_state(QUEUE, ("scheduled", "queued"), dag_id=DAG, run_id=run_id)
                 == {"scheduled": 3, "queued": 1}, 120, "one queued and three held by the pool",
                 on_timeout=lambda: str(client.counts_by_state(QUEUE, dag_id=DAG, run_id=run_id)))
        wait_for(lambda: s.worker(WORKER)[1].get("heldTasks") == 3, 10 * REFRESH, "the Sentinel to count them",
                 on_timeout=lambda: f"{s.worker(WORKER)}\n{s.daemon.tail()}")
        status, answer = s.worker(WORKER)
        assert status == 200, answer
        assert (backlog_of(answer), answer["queuedTasks"], answer["desiredReplicas"]) == (1, 1, 1), answer
        assert f'astro_sentinel_worker_held_tasks{{worker="{WORKER}"}} 3' in s.check_metrics()

        def held_back() -> dict | None:
            h = history(s)
            return h if any(f["kind"] == "heldBack" for f in h["findings"]) else None

        h = wait_for(held_back, 60, "the held-back finding", on_timeout=lambda: json.dumps(history(s)["findings"]))
        (found,) = [f for f in h["findings"] if f["kind"] == "heldBack"]
        print(f"{source}: {found['text']} (tiles {h['tiles']})")
        assert found["text"].startswith("Held below its maximum by Airflow for ")
        assert found["text"].endswith(": up to 3 tasks waited as scheduled."), found
        assert h["tiles"]["heldBackSeconds"] >= 9 and max(p["heldTasks"] for p in h["series"]) == 3
    finally:
        if run_id:
            client.set_run_state(DAG, run_id, "failed")
        s.stop()
        for step in cleanup:
            try:
                step()
            except Exception as e:  # keep cleaning up
                print(f"cleanup step failed: {e}")
