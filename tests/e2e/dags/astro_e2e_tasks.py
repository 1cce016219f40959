"""Shared building blocks of the end-to-end test DAGs (imported by the DAG files,
listed in .airflowignore so the dag-processor does not parse it on its own).

Every task prints one marker line, then does its work:

    astro-e2e marker dag=<dag_id> task=<task_id> run=<run_id> try=<n> map=<i>

so a test can find it in the task log the airflow REST API shows. Every DAG: no
schedule, no catchup, no retries (a failure stays visible), and
``max_active_tasks`` at least its task count so a whole run is queued at once.
One DAG per file keeps the per-task parse cost on the worker small.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, get_current_context, task

MARKER = "astro-e2e marker"


def marker_line() -> str:
    ti = get_current_context()["ti"]
    return f"{MARKER} dag={ti.dag_id} task={ti.task_id} run={ti.run_id} try={ti.try_number} map={ti.map_index}"


@task
def sleeper(seconds: float) -> None:
    print(marker_line(), flush=True)
    time.sleep(seconds)


@task
def failer() -> None:
    print(marker_line(), flush=True)
    raise RuntimeError("astro-e2e intended failure")


@task
def fails_on_first_try() -> None:
    """Fails its first try and succeeds on the next (give it a retry)."""
    print(marker_line(), flush=True)
    if get_current_context()["ti"].try_number == 1:
        raise RuntimeError("astro-e2e intended failure on the first try")


@task
def big_logger(lines: int) -> None:
    print(marker_line(), flush=True)
    filler = "x" * 90
    for i in range(lines):
        print(f"astro-e2e filler {i:06d} {filler}")
    print("astro-e2e end of big log", flush=True)


#: Where ``callback_marker`` leaves its files, under the worker's AIRFLOW_HOME.
CALLBACK_FOLDER = "astro-e2e-callbacks"
#: How long ``callback_marker`` waits for its release before it fails.
CALLBACK_HOLD_LIMIT = 300.0


def callback_marker(context) -> None:
    """An executor callback (a deadline alert's ``SyncCallback``): prints the marker, writes
    ``<AIRFLOW_HOME>/astro-e2e-callbacks/<run_id>.started``, stays running until the test writes
    ``<run_id>.release`` next to it (so its running state can be counted), then writes
    ``<run_id>.done``. ``context`` is what the scheduler sends along (the DAG run, the deadline)."""
    run_id = context["dag_run"]["dag_run_id"]
    folder = Path(os.environ["AIRFLOW_HOME"]) / CALLBACK_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{MARKER} callback run={run_id} pid={os.getpid()}", flush=True)
    (folder / f"{run_id}.started").write_text(str(os.getpid()))
    give_up = time.monotonic() + CALLBACK_HOLD_LIMIT
    while not (folder / f"{run_id}.release").exists():
        if time.monotonic() > give_up:
            raise TimeoutError(f"no {run_id}.release in {folder} after {CALLBACK_HOLD_LIMIT} s")
        time.sleep(0.1)
    (folder / f"{run_id}.done").write_text(str(os.getpid()))


def e2e_dag(dag_id: str, queue: str, max_active_tasks: int, schedule=None, **more) -> DAG:
    """An empty DAG with the common settings (no schedule unless given; ``more`` goes to the
    DAG as it is); use it as a context manager."""
    return DAG(
        **more,
        dag_id=dag_id,
        schedule=schedule,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_tasks=max_active_tasks,
        max_active_runs=16,
        tags=["astro-e2e"],
        default_args={"queue": queue, "retries": 0},
    )


def sleeper_dag(dag_id: str, tasks: int, queue: str, seconds: float) -> DAG:
    """``tasks`` independent tasks ``t00``, ``t01``, ... on ``queue``, each sleeping ``seconds``."""
    with e2e_dag(dag_id, queue, tasks) as dag:
        for i in range(tasks):
            sleeper.override(task_id=f"t{i:02d}")(seconds)
    return dag
