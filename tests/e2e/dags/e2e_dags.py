"""DAGs for the end-to-end tests (Airflow 3 task SDK).

Every task prints one marker line, then sleeps:

    astro-e2e marker dag=<dag_id> task=<task_id> run=<run_id> try=<n> map=<i>

so a test can find it in the log Airflow shows. Every DAG: no schedule, no
catchup, no retries (a failure stays visible), and ``max_active_tasks`` equal
to its task count so a whole run can be queued at once.

| dag_id         | tasks | queue    | seconds | notes                                  |
| -------------- | ----- | -------- | ------- | -------------------------------------- |
| e2e_short_40   | 40    | default  | 1       |                                        |
| e2e_long_8     | 8     | default  | 20      |                                        |
| e2e_queued_30  | 30    | sentinel | 1       | nothing serves `sentinel` unless asked |
| e2e_queue_a    | 10    | qa       | 30      |                                        |
| e2e_queue_b    | 10    | qb       | 30      |                                        |
| bench_32x3     | 32    | bench    | 3       |                                        |
| bench_16x60    | 16    | bench    | 60      |                                        |
| e2e_fail_1     | 1     | default  | 0       | raises after the marker: ends `failed` |
| e2e_mapped_4   | 4     | default  | 1       | one mapped task, map_index 0..3        |
| e2e_slots_2x4  | 4     | default  | 5       | pool_slots=2 -> job concurrency_slots 2|
| e2e_big_log    | 1     | default  | 0       | ~1.5 MB of log lines after the marker  |
"""

from __future__ import annotations

import time
from datetime import datetime

from airflow.sdk import DAG, get_current_context, task

START = datetime(2024, 1, 1)
MARKER = "astro-e2e marker"


def _marker() -> str:
    ti = get_current_context()["ti"]
    return f"{MARKER} dag={ti.dag_id} task={ti.task_id} run={ti.run_id} try={ti.try_number} map={ti.map_index}"


@task
def sleeper(seconds: float) -> None:
    print(_marker(), flush=True)
    time.sleep(seconds)


@task
def mapped_sleeper(seconds: float) -> None:
    print(_marker(), flush=True)
    time.sleep(seconds)


@task
def failer() -> None:
    print(_marker(), flush=True)
    raise RuntimeError("astro-e2e intended failure")


@task
def big_logger(lines: int = 15000) -> None:
    print(_marker(), flush=True)
    filler = "x" * 90
    for i in range(lines):
        print(f"astro-e2e filler {i:06d} {filler}")
    print(f"astro-e2e end of big log", flush=True)


def _dag(dag_id: str, tasks: int, queue: str) -> DAG:
    return DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_tasks=max(tasks, 1),
        max_active_runs=16,
        tags=["astro-e2e"],
        default_args={"queue": queue, "retries": 0},
    )


def sleeper_dag(dag_id: str, tasks: int, queue: str, seconds: float) -> DAG:
    with _dag(dag_id, tasks, queue) as dag:
        for i in range(tasks):
            sleeper.override(task_id=f"t{i:02d}")(seconds)
    return dag


for _id, _n, _q, _s in [
    ("e2e_short_40", 40, "default", 1),
    ("e2e_long_8", 8, "default", 20),
    ("e2e_queued_30", 30, "sentinel", 1),
    ("e2e_queue_a", 10, "qa", 30),
    ("e2e_queue_b", 10, "qb", 30),
    ("bench_32x3", 32, "bench", 3),
    ("bench_16x60", 16, "bench", 60),
]:
    sleeper_dag(_id, _n, _q, _s)

with _dag("e2e_fail_1", 1, "default"):
    failer.override(task_id="fail")()

with _dag("e2e_mapped_4", 4, "default"):
    mapped_sleeper.override(task_id="mapped").expand(seconds=[1, 1, 1, 1])

with _dag("e2e_slots_2x4", 8, "default"):
    for _i in range(4):
        sleeper.override(task_id=f"t{_i:02d}", pool_slots=2)(5)

with _dag("e2e_big_log", 1, "default"):
    big_logger.override(task_id="big")()
