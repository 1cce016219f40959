"""End-to-end tests against a real Apache Airflow 3.3.2 + Edge provider 5.1.0 on PostgreSQL.

How to run (from the repository root):

    V=$(tests/lib/venvs.sh tools) && "$V/bin/python" -m pytest tests/e2e -x -v

``tests/lib/venvs.sh`` is the one place that says which requirement files make up
the ``tools`` venv (pytest runs in it) and the ``airflow`` venv (only used to run
the Airflow daemons, the Python edge worker and task processes; test code never
imports airflow). Both are cached under ``${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}``.

Fixtures:
* ``airflow`` (session): an :class:`harness.airflow_stack.AirflowStack` that is up — started
  once per session, stopped at the end (also on failure or Ctrl-C). Addresses,
  secrets and worker environments are attributes/methods of it; ``airflow.client``
  is a logged-in :class:`harness.airflow_client.AirflowClient`.
* ``trigger_dag``: ``trigger_dag(dag_id) -> run_id`` waits for the DAG to be parsed,
  unpauses it and starts a run with a unique run id. Runs this test started that
  are still unfinished when it ends are abandoned (:meth:`AirflowStack.abandon_run`:
  run set to ``failed``, its queued edge jobs deleted), so they do not leak into the
  next test's counts or hand a later worker stale jobs.
* ``python_edge_worker``: ``python_edge_worker(name=..., queues=[...], concurrency=N)``
  starts the real Python ``airflow edge worker``; every worker started is stopped
  when the test ends.

Environment: ``ASTRO_E2E_KEEP=1`` keeps the stack's temp folder (daemon logs,
task logs) after the session.

Tests should be independent: trigger their own runs, use a queue only they
serve, and not rely on what earlier tests left behind.
"""

from __future__ import annotations

import signal

import pytest

from harness.airflow_client import AirflowClient
from harness.airflow_stack import AirflowStack
from harness.python_edge_worker import PythonEdgeWorker


def pytest_configure(config):
    # SIGTERM (e.g. a CI timeout) should tear the stack down like Ctrl-C does.
    def _raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise_interrupt)


@pytest.fixture(scope="session")
def airflow():
    """The running Airflow stack (one per pytest session)."""
    stack = AirflowStack()
    try:
        stack.start()
        print(f"\nAirflow stack up in {stack.timings['total']:.1f}s: "
              + ", ".join(f"{k} {v:.1f}s" for k, v in stack.timings.items() if k != "total")
              + f"; {stack.api_base}; workdir {stack.workdir}")
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def trigger_dag(airflow):
    """``trigger_dag(dag_id, run_id=None, conf=None) -> run_id``; cleans up unfinished runs."""
    client: AirflowClient = airflow.client
    started: list[tuple[str, str]] = []

    def trigger(dag_id: str, run_id: str | None = None, conf: dict | None = None) -> str:
        run = client.trigger(dag_id, run_id=run_id, conf=conf)
        started.append((dag_id, run))
        return run

    yield trigger

    for dag_id, run in started:
        try:
            airflow.abandon_run(dag_id, run)
        except Exception as e:  # the stack may be half-down after a failure
            print(f"could not clean up {dag_id}/{run}: {e}")


@pytest.fixture
def python_edge_worker(airflow):
    """Factory for real Python edge workers; all are stopped (SIGINT drain) at test end."""
    workers: list[PythonEdgeWorker] = []

    def start(**kwargs) -> PythonEdgeWorker:
        worker = PythonEdgeWorker(airflow, **kwargs)
        workers.append(worker)
        return worker.start()

    yield start

    for worker in workers:
        worker.stop()
