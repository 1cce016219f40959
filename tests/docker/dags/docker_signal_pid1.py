"""airflow DAG for the docker stage's worker Pod (test_pod.py): a task that signals PID 1 of
its container -- the task host -- to stop every task of the worker, as any DAG author's task
could on a shared pool (same user, same PID namespace).

``signal_pid1`` sends SIGTERM and SIGINT to PID 1 and prints ``astro-signal-pid1: sent``;
``bystander``, another task of the worker running meanwhile, and ``after``, the next task once
the signaller is done, only have to succeed: were the task host to obey, neither would.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime

from airflow.sdk import DAG, task


@task
def signal_pid1() -> str:
    for sig in (signal.SIGTERM, signal.SIGINT):
        os.kill(1, sig)
    print("astro-signal-pid1: sent SIGTERM and SIGINT to PID 1", flush=True)
    # Long enough for an obeyed signal to have stopped this task too.
    time.sleep(3)
    return "sent"


@task
def bystander() -> str:
    time.sleep(10)
    return "ran"


@task
def after() -> str:
    return "ran"


with DAG(dag_id="docker_signal_pid1", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["astro-docker"], default_args={"queue": "pod", "retries": 0}):
    signal_pid1() >> after()
    bystander()
