"""airflow DAG for the docker stage's worker Pod (test_pod.py): two tasks on queue ``pod``, run at
the same time in the tasks container, each hunting for the agent's secrets wherever a task
could reach them.

The run's conf: ``reversed_canaries`` (each secret written backwards, so that no copy of the
conf anywhere holds a secret itself), ``log_folder`` (the volume the task logs go to) and,
optionally, ``search_folders``: the folders to search instead of the whole filesystem.
Searched, everything the task's user may open:

* its own environment;
* every process it can see in ``/proc``: ``cmdline``, ``environ``, every open file through
  ``fd/*``, and every path named on a command line (``/x`` or ``--flag=/x``), file or folder;
* every file outside the image's software (``/usr``, the interpreter, the venv, ``/proc``,
  ``/sys``, ``/dev``): ``/etc``, ``/tmp``, ``/run``, ``/opt`` (the
  binary's volume, the logs, AIRFLOW_HOME), ``/home``, ``/dev/shm``, and the folder the chart
  mounts the agent's secrets at, ``/etc/astro-agent/secrets``;
* the other task's files: the two tasks meet (each waits for the other to start) before
  either searches and leave only when both are done, so each one's work files, whatever the
  task host keeps for it, exist during the other's search. Each looks for the other's task
  instance id in what it reads.

The task fails when it finds a secret. Its return value (an XCom) and its log say what it
could read — paths, never contents — so that a search that read nothing cannot pass for a clean
one, and which processes it saw (the test checks the agent is not one of them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
import sys
import time
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, get_current_context, task

MAX_FILE_BYTES = 32 * 1024 * 1024
RENDEZVOUS = Path("/tmp/astro-canary-hunt")
#: The image's software: large, read-only, the same in every container of the image.
SOFTWARE = ("/proc", "/sys", "/dev", "/usr", "/bin", "/sbin", "/lib", "/lib64", sys.prefix, sys.base_prefix)
EXTRA_FOLDERS = ("/dev/shm", "/etc/astro-agent/secrets")
MEET_TIMEOUT = 240.0


def _wait_for(path: Path, what: str) -> str:
    """The other task's mark, once it is there. Polling: the two tasks share nothing but files."""
    deadline = time.monotonic() + MEET_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other task did not {what} within {MEET_TIMEOUT:.0f}s")
        time.sleep(0.05)
    return path.read_text()


class Hunt:
    def __init__(self, canaries: list[bytes], partner_id: bytes):
        self.canaries = canaries
        self.partner_id = partner_id
        self.found: list[str] = []
        self.read: set[str] = set()
        self.refused: set[str] = set()
        self.partner_seen: set[str] = set()
        self.visited: set[str] = set()

    def search(self, where: str, data: bytes) -> None:
        for i, canary in enumerate(self.canaries):
            if canary in data:
                self.found.append(f"canary #{i} in {where}")
        if self.partner_id in data and not where.startswith(str(RENDEZVOUS)):
            self.partner_seen.add(where)

    def mask(self, text: str) -> str:
        for i, canary in enumerate(self.canaries):
            text = text.replace(canary.decode(errors="replace"), f"<canary #{i}>")
        return text

    def open_path(self, path: str, where: str | None = None) -> None:
        """Reads a file, or every file below a folder; other kinds (sockets, devices) are not read."""
        where = where or path
        try:
            st = os.stat(path)
        except OSError:
            return
        if stat.S_ISDIR(st.st_mode):
            self.walk(path)
        elif stat.S_ISREG(st.st_mode) and st.st_size <= MAX_FILE_BYTES:
            try:
                # Non-blocking: a FIFO without a writer would block the open.
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                self.refused.add(where)
                return
            with open(fd, "rb") as f:
                try:
                    data = f.read()
                except OSError:  # a file that cannot be read as one (a namespace file: EINVAL)
                    self.refused.add(where)
                    return
            self.search(where, data)
            self.read.add(where)

    def walk(self, top: str) -> None:
        if top in self.visited or _software(top):
            return
        self.visited.add(top)
        def refused(error: OSError) -> None:
            if not isinstance(error, FileNotFoundError):  # a folder that is not there hides nothing
                self.refused.add(str(error.filename))

        for dirpath, dirnames, filenames in os.walk(top, onerror=refused):
            dirnames[:] = [d for d in dirnames if not _software(os.path.join(dirpath, d))]
            for name in filenames:
                self.open_path(os.path.join(dirpath, name))

    def process(self, pid: str) -> dict:
        """One process's /proc files, open files and the paths on its command line."""
        proc = f"/proc/{pid}"
        seen: dict = {"pid": int(pid)}
        for name in ("cmdline", "environ"):
            try:
                data = Path(proc, name).read_bytes()
            except FileNotFoundError:
                return seen  # ended meanwhile
            except OSError:
                self.refused.add(f"{proc}/{name}")
                seen[name] = "unreadable"
                continue
            self.read.add(f"{proc}/{name}")
            self.search(f"{proc}/{name}", data)
            seen[name] = "read"
            if name == "cmdline":
                argv = [a.decode(errors="replace") for a in data.split(b"\0") if a]
                seen["argv"] = [self.mask(a) for a in argv]
                for arg in argv:
                    for candidate in re.findall(r"(?:^|=)(/[^\s:=]*)", arg):
                        self.open_path(candidate, f"{candidate} (on {proc}/cmdline)")
        try:
            fds = os.listdir(f"{proc}/fd")
        except OSError:
            self.refused.add(f"{proc}/fd")
            fds = []
        seen["fds"] = len(fds)
        for fd in fds:
            link = f"{proc}/fd/{fd}"
            try:
                target = os.readlink(link)
            except OSError:
                target = "?"
            # Through the magic link itself: it opens the file whatever its path (deleted too).
            self.open_path(link, f"{link} -> {target}")
        return seen


def _software(path: str) -> bool:
    return any(path == s or path.startswith(s.rstrip("/") + "/") for s in SOFTWARE)


@task
def hunt(partner: str) -> dict:
    context = get_current_context()
    ti, conf = context["ti"], context["dag_run"].conf
    print(f"astro-canary-hunt task={ti.task_id} run={ti.run_id}", flush=True)

    meeting = RENDEZVOUS / ti.run_id
    meeting.mkdir(parents=True, exist_ok=True)
    (meeting / f"{ti.task_id}.started").write_text(str(ti.id))
    partner_id = _wait_for(meeting / f"{partner}.started", "start")

    h = Hunt([c[::-1].encode() for c in conf["reversed_canaries"]], partner_id.encode())
    h.search("the task's own environment", json.dumps(dict(os.environ)).encode())
    processes = [h.process(pid) for pid in sorted(os.listdir("/proc"), key=lambda p: (len(p), p)) if pid.isdigit()]
    # A container's whole filesystem, unless the run names the folders that make up its view (a
    # kubelet stand-in's containers see the host's files besides their volumes).
    for root in conf.get("search_folders") or ["/"]:
        h.walk(root)
    for folder in (*EXTRA_FOLDERS, conf["log_folder"]):
        h.walk(folder)

    (meeting / f"{ti.task_id}.done").write_text("")
    _wait_for(meeting / f"{partner}.done", "finish its search")

    summary = {
        "found": h.found,
        "read": sorted(h.read),
        "refused": sorted(h.refused),
        "partner_seen_in": sorted(h.partner_seen),
        "processes": processes,
        "secrets_folder_exists": os.path.exists("/etc/astro-agent/secrets"),
        "edge_provider_importable": importlib.util.find_spec("airflow.providers.edge3") is not None,
        "uid": os.getuid(),
    }
    print(f"astro-canary-hunt found: {h.found}", flush=True)
    print("astro-canary-hunt summary: " + json.dumps(summary, indent=1), flush=True)
    if h.found:
        raise RuntimeError(f"the agent's secrets are readable by a task: {h.found}")
    return summary


with DAG(
    dag_id="docker_canary_hunt",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_tasks=2,
    tags=["astro-docker"],
    default_args={"queue": "pod", "retries": 0},
):
    hunt.override(task_id="hunt_a")(partner="hunt_b")
    hunt.override(task_id="hunt_b")(partner="hunt_a")
