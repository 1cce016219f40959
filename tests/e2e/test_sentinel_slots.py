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
import secrets
import time
from urllib.parse import urlparse

import pytest

from harness.procs import wait_for

from test_sentinel import QUEUE, REFRESH, Sentinel, backlog_of, sentinel_bin  # noqa: F401 (a fixture)

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
    if source == "airflow-api":
        source_config = {"type": "airflow-api", "airflowApi": {"url": airflow.api_base}}
        env = {"ASTRO_SENTINEL_AIRFLOW_USERNAME": "admin", "ASTRO_SENTINEL_AIRFLOW_PASSWORD": "admin"}
    else:
        role, password = f"sentinel_ro_{secrets.token_hex(4)}", secrets.token_hex(16)
        airflow.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        airflow.sql(f"GRANT SELECT ON task_instance TO {role}")
        cleanup.append(lambda: airflow.sql(f"DROP OWNED BY {role}"))
        cleanup.append(lambda: airflow.sql(f"DROP ROLE {role}"))
        pg = urlparse(airflow.postgres_url)
        source_config = {"type": "postgres", "postgres": {"sslMode": "disable"}}
        env = {"ASTRO_SENTINEL_POSTGRES_URL": f"postgres://{role}:{password}@127.0.0.1:{pg.port}{pg.path}"}
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
    time.sleep(3 * REFRESH)
    later = s.worker(WORKER)[1]["oldestQueuedAgeSeconds"]
    assert later >= first + 2 * REFRESH, (first, later)
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


# ---- upstream cost of the airflow-api source at 10 000 queued task instances ---------------

BENCH_QUEUE = "bench-10k"
BENCH_TASKS = 10_000
BENCH_REFRESH = 30.0  # seconds: longer than a refresh of 10 000 takes here
# Values are dated from the start of a read: the limit must be above how long a read takes.
BENCH_STALENESS = 120.0


def fill_queue_with_copies(airflow, template_id: str, n: int) -> None:
    """``n`` copies of one real task instance row on BENCH_QUEUE, queued, alternating 1 and 3
    slots, queued 1 ms apart: what the REST API lists is Airflow's own rows, joins and
    serialisation, without scheduling 10 000 tasks (the stack's parallelism is 512)."""
    columns = airflow.sql(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_name = 'task_instance' ORDER BY ordinal_position"
    ).split()
    replaced = {
        "id": "gen_random_uuid()",
        "map_index": "1000000 + g",
        "queue": f"'{BENCH_QUEUE}'",
        "state": "'queued'",
        "pool_slots": "1 + 2 * (g % 2)",
        "queued_dttm": "now() - g * interval '1 millisecond'",
    }
    select = ", ".join(replaced.get(c, f"t.{c}") for c in columns)
    airflow.sql(
        f"INSERT INTO task_instance ({', '.join(columns)}) SELECT {select} "
        f"FROM task_instance t, generate_series(1, {n}) g WHERE t.id = '{template_id}'"
    )


def test_airflow_api_cost_at_10000_queued(airflow, trigger_dag, sentinel_bin, tmp_path):
    """Measures requests and seconds per refresh for one queue of 10 000 queued task instances
    (Airflow's default ``[api] maximum_page_limit`` of 100), and that the answer is exact."""
    client = airflow.client
    run_id = trigger_dag("e2e_queued_30")
    wait_for(lambda: client.count(QUEUE, ["queued"]) >= 1, 120, "a queued task instance to copy")
    template = airflow.sql(
        f"SELECT id FROM task_instance WHERE run_id = '{run_id}' AND state = 'queued' LIMIT 1"
    ).strip()
    try:
        fill_queue_with_copies(airflow, template, BENCH_TASKS)
        assert client.count(BENCH_QUEUE, ["queued"]) == BENCH_TASKS
        slots = BENCH_TASKS // 2 * 1 + BENCH_TASKS // 2 * 3
        workers = [{"name": "astro-worker-bench", "queues": [BENCH_QUEUE], "syncSlots": 16,
                    "minReplicas": 0, "maxReplicas": 2000}]
        s = Sentinel(sentinel_bin, tmp_path / "bench", {"type": "airflow-api", "airflowApi": {"url": airflow.api_base}},
                     {"ASTRO_SENTINEL_AIRFLOW_USERNAME": "admin", "ASTRO_SENTINEL_AIRFLOW_PASSWORD": "admin"},
                     workers=workers, refresh=BENCH_REFRESH, staleness=BENCH_STALENESS)
        try:
            s.start()
            wait_for(lambda: s.backlog("astro-worker-bench") is not None, BENCH_STALENESS, "the first refresh",
                     on_timeout=s.daemon.tail)
            status, body = s.worker("astro-worker-bench")
            assert (body["queuedTasks"], body["queued"], body["backlog"]) == (BENCH_TASKS, slots, slots), body
            assert body["desiredReplicas"] == math.ceil(slots / 16)
            assert body["oldestQueuedAgeSeconds"] >= BENCH_TASKS / 1000, body
            # Counters read just after a refresh ends, while the next one has not begun (the
            # interval is longer than a refresh), so that no request in flight blurs the count.
            def after_next_refresh() -> tuple[float, float, float]:
                done = s.metric("astro_sentinel_refreshes_total")
                wait_for(lambda: s.metric("astro_sentinel_refreshes_total") > done, 2 * BENCH_REFRESH + BENCH_STALENESS,
                         "the next refresh", interval=0.05)
                return (s.metric("astro_sentinel_refreshes_total"), s.metric("astro_sentinel_upstream_requests_total"),
                        s.metric("astro_sentinel_refresh_duration_seconds_sum"))

            r0, q0, d0 = after_next_refresh()
            after_next_refresh()
            r1, q1, d1 = after_next_refresh()
            refreshes = r1 - r0
            per_refresh = (q1 - q0) / refreshes
            seconds = (d1 - d0) / refreshes
            print(f"\nairflow-api, {BENCH_TASKS} queued on one queue: {per_refresh:.1f} requests and "
                  f"{seconds:.2f}s per refresh ({refreshes:.0f} refreshes)")
            # 10 000 at 100 a page, and the list of Edge workers once per refresh interval on its
            # own loop (so one more or one fewer of those can fall in the window).
            pages = math.ceil(BENCH_TASKS / 100)
            assert pages + 0.5 <= per_refresh <= pages + 1.5, per_refresh
            assert seconds < BENCH_REFRESH, "a refresh ran into the next: the counts are blurred"
            assert s.worker("astro-worker-bench")[0] == 200
        finally:
            s.stop()
    finally:
        airflow.sql(f"DELETE FROM task_instance WHERE queue = '{BENCH_QUEUE}'")
