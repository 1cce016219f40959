"""The Sentinel's upstream cost for the airflow-api source at 10 000 queued task instances on one
queue, against the real Airflow stack.

The 10 000 are copies of one real queued task instance, put in task_instance with SQL (see
:func:`fill_queue_with_copies`). Queued, they take every slot of Airflow's default pool while
they exist, so that no other task would be scheduled: the test runs on ``own_airflow``, a stack
no other test uses meanwhile (tests/e2e/conftest.py).
"""

from __future__ import annotations

import math

import pytest

from harness.procs import wait_for

from test_sentinel import QUEUE, Sentinel, sentinel_bin  # noqa: F401 (a fixture)


@pytest.fixture
def airflow(own_airflow):
    """This module's tests, ``trigger_dag`` included, run on a stack no other test uses."""
    return own_airflow


# ---- upstream cost of the airflow-api source at 10 000 queued task instances ---------------

BENCH_QUEUE = "bench-10k"
BENCH_TASKS = 10_000
BENCH_REFRESH = 60.0  # seconds: longer than a refresh of 10 000 takes here, even loaded (41.6 s seen)
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
                     workers=workers, refresh=BENCH_REFRESH, staleness=BENCH_STALENESS,
                     # At least the refresh interval (the Sentinel refuses less).
                     settings={"heldTasksInterval": f"{int(BENCH_REFRESH)}s"})
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
                # The held-back count (one request for the one queue, every interval) is not a
                # refresh's cost: taken out.
                return (s.metric("astro_sentinel_refreshes_total"),
                        s.metric("astro_sentinel_upstream_requests_total") - s.metric("astro_sentinel_held_task_reads_total"),
                        s.metric("astro_sentinel_refresh_duration_seconds_sum"))

            r0, q0, d0 = after_next_refresh()
            r1, q1, d1 = after_next_refresh()
            refreshes = r1 - r0
            per_refresh = (q1 - q0) / refreshes
            seconds = (d1 - d0) / refreshes
            print(f"\nairflow-api, {BENCH_TASKS} queued on one queue: {per_refresh:.1f} requests and "
                  f"{seconds:.2f}s per refresh ({refreshes:.0f} refreshes)")
            # 10 000 at 100 a page, the list of executor callbacks (one for all queues), and the
            # list of Edge workers once per refresh interval on its own loop (so none or two of
            # those can fall in the one refresh's window).
            pages = math.ceil(BENCH_TASKS / 100)
            assert refreshes == 1 and pages + 1 <= per_refresh <= pages + 3, (refreshes, per_refresh)
            assert seconds < BENCH_REFRESH, "a refresh ran into the next: the counts are blurred"
            assert s.worker("astro-worker-bench")[0] == 200
        finally:
            s.stop()
    finally:
        airflow.sql(f"DELETE FROM task_instance WHERE queue = '{BENCH_QUEUE}'")
