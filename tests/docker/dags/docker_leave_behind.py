"""airflow DAG for the docker stage's worker Pod (test_pod.py): a task that leaves a process
behind, as any DAG author's task could on a shared pool -- a daemon (double fork, a session of
its own) that outlives the task and, unended, every later task of the worker, with the task
host's user and network namespace.

``litter`` starts the daemon (a fork that sleeps 600 s), writes its pid (in the tasks container's PID
namespace) to ``leftover.pid`` in the log folder given in the run's conf, and succeeds.
"""

from __future__ import annotations

import os
import time
from datetime import datetime

from airflow.sdk import DAG, get_current_context, task


@task
def litter() -> int:
    pid_file = os.path.join(get_current_context()["dag_run"].conf["log_folder"], "leftover.pid")
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode())
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            # As a daemon does: nothing of the task's open (the supervisor would wait for its
            # pipes to close, and the task would never end).
            os.closerange(3, 65536)
            time.sleep(600)
        os._exit(0)
    os.close(write)
    pid = int(os.read(read, 32))
    with open(pid_file, "w") as f:
        f.write(str(pid))
    print(f"astro-leave-behind: daemon {pid}", flush=True)
    return pid


with DAG(dag_id="docker_leave_behind", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["astro-docker"], default_args={"queue": "pod", "retries": 0}):
    litter()
