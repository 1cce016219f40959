"""airflow DAG for the docker stage's worker Pod (test_pod.py): a task that races the other
tasks' links to the task host, where their supervisors' output goes (Airflow 3.0's supervisor
prints its workload there, Execution API token included), and ordinary tasks to race.

``race`` does what any DAG author's task could on a shared pool, as the task host's user, for
``WATCH_SECONDS``:

* it watches the task host's work folders in the temporary folder (older agents kept each
  task's output there as a named file, and a claim file beside it) and opens every output file
  it sees before its name goes;
* it watches for new children of PID 1 (a fresh interpreter is one) and opens their stdout
  again through ``/proc/<pid>/fd/1`` in the moment before they make themselves undumpable;
* it writes what it opened (path, kind) to ``race-opened`` in the log folder, and prints how
  much it looked (``astro-work-file-race: ...``).

``v0`` .. ``v2`` run one after another beside it once ``pause`` has given it a head start; each
only has to run.
"""

from __future__ import annotations

import glob
import json
import os
import stat
import tempfile
import time
from datetime import datetime

from airflow.sdk import DAG, get_current_context, task

OPENED = "race-opened"
WATCH_SECONDS = 30
VICTIMS = 3


def parent_of(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def kind(fd: int) -> str:
    mode = os.fstat(fd).st_mode
    return "file" if stat.S_ISREG(mode) else "pipe" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "other"


@task
def race() -> None:
    opened_log = os.path.join(get_current_context()["dag_run"].conf["log_folder"], OPENED)
    seen_names, seen_pids, held = set(), set(), []
    refused = {}
    folders_seen = set()
    scans = 0
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        scans += 1
        for folder in glob.glob(os.path.join(tempfile.gettempdir(), "astro-agent-*")):
            folders_seen.add(folder)
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if name.endswith(".out") and name not in seen_names:
                    seen_names.add(name)
                    try:
                        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
                    except OSError as e:
                        refused[name] = str(e)
                        continue
                    held.append({"path": os.path.join(folder, name), "kind": kind(fd)})
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid in seen_pids or parent_of(pid) != 1:
                continue
            seen_pids.add(pid)
            try:
                fd = os.open(f"/proc/{pid}/fd/1", os.O_RDONLY | os.O_NONBLOCK)
            except OSError as e:
                refused[f"/proc/{pid}/fd/1"] = str(e)
                continue
            what = kind(fd)
            if what != "other":  # /dev/null: a spare's, nobody's output
                held.append({"path": f"/proc/{pid}/fd/1", "kind": what})
        time.sleep(0.0005)
    with open(opened_log, "w") as f:
        json.dump(held, f)
    print(f"astro-work-file-race: {scans} scans, work folders {sorted(folders_seen)}, "
          f"{len(seen_pids)} children of PID 1, opened {held}, refused {refused}", flush=True)


@task
def pause() -> None:
    time.sleep(3)


@task
def victim() -> str:
    return "ran"


with DAG(dag_id="docker_work_file_race", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["astro-docker"], default_args={"queue": "pod", "retries": 0}):
    race()
    previous = pause()
    for i in range(VICTIMS):
        current = victim.override(task_id=f"v{i}")()
        previous >> current
        previous = current
