"""The Sentinel's backlog in task slots and its oldest-queued age, against the real Airflow
stack, for both sources.

DAG ``e2e_slots_mix`` queues 7 tasks on queue ``sentinel`` (nothing serves it unless the test
does): 4 with ``pool_slots=1`` and 3 with ``pool_slots=3``, 13 slots. An Edge job takes its task's
``pool_slots`` of a worker's slots, so with ``syncSlots`` 4 the pool needs ceil(13 / 4) = 4
workers, not the ceil(7 / 4) = 2 a task count would give.

1. Queued, no worker: ``queued``/``backlog`` 13 slots, ``queuedTasks`` 7, ``desiredReplicas`` 4,
   and ``oldestQueuedAgeSeconds`` equal to Airflow's own oldest ``queued_dttm`` and growing while
   nothing runs (gauge ``astro_sentinel_worker_oldest_queued_age_seconds`` beside it).
2. A real Python edge worker with 13 slots starts: all 7 run at once → ``running`` 13 slots,
   ``runningTasks`` 7, nothing queued, so the age drops to 0; then the backlog drains to 0.
"""

from __future__ import annotations

import math

import pytest

from harness.procs import wait_for

from test_sentinel import plain_source, QUEUE, REFRESH, Sentinel, backlog_of, sentinel_bin  # noqa: F401 (a fixture)

DAG = "e2e_slots_mix"
TASKS, SLOTS = 7, 4 * 1 + 3 * 3
SYNC_SLOTS = 4
WORKER = "astro-worker-slots"
WORKERS = [{"name": WORKER, "queues": [QUEUE], "syncSlots": SYNC_SLOTS, "minReplicas": 0, "maxReplicas": 10}]


def oldest_queued_wait(airflow) -> float:
    """Airflow's own answer: seconds since the oldest queued task instance on the queue was queued."""
    out = airflow.sql(
        "SELECT extract(epoch FROM now() - min(queued_dttm)) FROM task_instance "
        f"WHERE queue = '{QUEUE}' AND state = 'queued'"
    )
    return float(out.strip())


@pytest.mark.parametrize("source", ["airflow-api", "postgres"])
def test_backlog_in_slots_and_the_oldest_wait(source, airflow, trigger_dag, python_edge_worker,
                                               sentinel_bin, tmp_path):
    cleanup = []
    source_config, env = plain_source(airflow, source, "task_instance", cleanup)
    s = Sentinel(sentinel_bin, tmp_path / "sentinel", source_config, env, workers=WORKERS)
    try:
        s.start()
        run_scenario(source, airflow, trigger_dag, python_edge_worker, s)
    finally:
        s.stop()
        for step in cleanup:
            try:
                step()
            except Exception as e:  # keep cleaning up
                print(f"cleanup step failed: {e}")


def run_scenario(source, airflow, trigger_dag, python_edge_worker, s: Sentinel):
    client = airflow.client
    wait_for(lambda: s.backlog(WORKER) == 0, 30, "backlog 0 on an empty queue",
             on_timeout=lambda: f"{s.worker(WORKER)}\n{s.daemon.tail()}")
    assert s.worker(WORKER)[1]["oldestQueuedAgeSeconds"] == 0

    # 1. Queued, nothing serves the queue.
    trigger_dag(DAG)
    wait_for(lambda: client.count(QUEUE, ["queued"]) == TASKS, 120, f"{TASKS} queued on {QUEUE}")
    wait_for(lambda: s.worker(WORKER)[1].get("queuedTasks") == TASKS, 10 * REFRESH, "the Sentinel to see them",
             on_timeout=lambda: f"{s.worker(WORKER)}\n{s.daemon.tail()}")
    status, answer = s.worker(WORKER)
    assert status == 200, answer
    assert (answer["queued"], answer["running"], backlog_of(answer)) == (SLOTS, 0, SLOTS), answer
    assert (answer["queuedTasks"], answer["runningTasks"]) == (TASKS, 0), answer
    assert answer["desiredReplicas"] == math.ceil(SLOTS / SYNC_SLOTS) == 4, "a task count would say 2"
    metrics = s.check_metrics()
    assert f'astro_sentinel_worker_backlog{{worker="{WORKER}"}} {SLOTS}' in metrics
    assert f'astro_sentinel_queue_task_slots{{queue="{QUEUE}",state="queued"}} {SLOTS}' in metrics
    assert f'astro_sentinel_queue_task_instances{{queue="{QUEUE}",state="queued"}} {TASKS}' in metrics

    # The oldest wait: Airflow's own, within a refresh plus the time between the two reads.
    first = s.worker(WORKER)[1]["oldestQueuedAgeSeconds"]
    truth = oldest_queued_wait(airflow)
    print(f"{source}: oldest queued wait {first:.2f}s, Airflow says {truth:.2f}s")
    assert abs(first - truth) <= 2 * REFRESH + 0.5, (first, truth)
    # It grows while no worker runs (between refreshes too: the view adds the time since the read).
    # Polled for a served answer: on a loaded machine one read may come back stale (503).
    def grown() -> float | None:
        status, body = s.worker(WORKER)
        age = body.get("oldestQueuedAgeSeconds") if status == 200 else None
        return age if age is not None and age >= first + 2 * REFRESH else None

    later = wait_for(grown, 15 * REFRESH, "the oldest wait to grow",
                     on_timeout=lambda: f"{s.worker(WORKER)}\n{s.daemon.tail()}")
    gauge = s.metric(f'astro_sentinel_worker_oldest_queued_age_seconds{{worker="{WORKER}"}}')
    assert gauge >= later, (later, gauge)

    # 2. A worker with 13 slots runs all 7 at once: running in slots, and no one waits any more.
    worker = python_edge_worker(name=f"py-slots-{source}", queues=[QUEUE], concurrency=SLOTS)
    seen: list[dict] = []

    def all_running() -> bool:
        status, body = s.worker(WORKER)
        if status != 200:
            return False
        seen.append(body)
        return body["runningTasks"] == TASKS

    wait_for(all_running, 90, "all 7 running", interval=0.2,
             on_timeout=lambda: f"{seen[-3:]}; {client.counts_by_state(QUEUE)}")
    body = seen[-1]
    assert (body["running"], body["queued"], backlog_of(body)) == (SLOTS, 0, SLOTS), body
    assert body["oldestQueuedAgeSeconds"] == 0, body
    ages = [b["oldestQueuedAgeSeconds"] for b in seen]
    print(f"{source}: oldest queued wait while the worker picked them up: {ages[0]:.1f}s → {ages[-1]:.1f}s")
    assert later > 0 and ages[-1] == 0, ages

    wait_for(lambda: s.backlog(WORKER) == 0, 120, "the backlog to drain",
             on_timeout=lambda: f"{s.worker(WORKER)}; {client.counts_by_state(QUEUE)}")
    assert worker.stop() == 0
