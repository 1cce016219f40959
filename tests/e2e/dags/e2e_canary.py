"""airflow DAG for the end-to-end tests: one task on queue ``canary`` that looks for the
worker's secrets wherever a task could read them, and fails naming every place it found one.

The run's conf says what to look for and where: ``reversed_canaries`` (each secret written
backwards, so that no copy of the conf anywhere holds the secret itself), ``agent_pid`` and
``folders`` (the agent's work, log and home folders). Searched: ``environ`` and ``cmdline``
of PID 1, the agent and every process below it, the agent's open files through
``/proc/<agent>/fd``, and every file below the folders. The return value (an XCom) counts
what was read, so that a search that read nothing cannot pass for a clean one.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from astro_e2e_tasks import e2e_dag, marker_line

from airflow.sdk import get_current_context, task

MAX_FILE_BYTES = 16 * 1024 * 1024


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(text.rsplit(")", 1)[1].split()[1])
    return parents


def _below(root: int, parents: dict[int, int]) -> list[int]:
    """``root`` and every process whose chain of parents reaches it."""
    found = []
    for pid in parents:
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            found.append(pid)
    return sorted(found)


@task
def search_for_canaries() -> dict:
    print(marker_line(), flush=True)
    conf = get_current_context()["dag_run"].conf
    canaries = [c[::-1].encode() for c in conf["reversed_canaries"]]
    agent = int(conf["agent_pid"])
    found: list[str] = []
    counts = {"processes": 0, "proc_files_read": 0, "proc_files_refused": 0, "files_read": 0}

    def search(where: str, data: bytes) -> None:
        for i, canary in enumerate(canaries):
            if canary in data:
                found.append(f"canary #{i} in {where}")

    def read_proc(path: Path) -> bytes | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None  # the process ended meanwhile
        except OSError:
            counts["proc_files_refused"] += 1
            return None
        counts["proc_files_read"] += 1
        return data

    pids = sorted(set(_below(agent, _parents())) | {1})
    counts["processes"] = len(pids)
    agent_environ = "unreadable"
    for pid in pids:
        for name in ("environ", "cmdline"):
            data = read_proc(Path(f"/proc/{pid}/{name}"))
            if data is not None:
                search(f"/proc/{pid}/{name}", data)
                if pid == agent and name == "environ":
                    agent_environ = "readable"
    # The agent's open files, whatever their path.
    try:
        fds = list(Path(f"/proc/{agent}/fd").iterdir())
    except OSError:
        fds = []
    counts["agent_fds_listed"] = len(fds)
    counts["agent_fds_opened"] = 0
    for fd in fds:
        try:
            # Through the magic link itself: it opens the agent's file whatever its path.
            # Non-blocking: a pipe without a writer would block the open.
            with open(os.open(fd, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                counts["agent_fds_opened"] += 1
                st = os.fstat(f.fileno())
                if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_FILE_BYTES:
                    search(f"the agent's fd {fd.name}", f.read())
                    counts["files_read"] += 1
        except OSError:
            pass
    for folder in conf["folders"]:
        for dirpath, _, filenames in os.walk(folder):
            for filename in filenames:
                path = Path(dirpath, filename)
                try:
                    if path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                        search(str(path), path.read_bytes())
                        counts["files_read"] += 1
                except OSError:
                    pass
    summary = {**counts, "agent_environ": agent_environ, "found": found}
    print(f"astro-e2e canary search: {summary}", flush=True)
    if found:
        raise RuntimeError(f"the worker's secrets are readable by a task: {found}")
    return summary


with e2e_dag("e2e_canary", queue="canary", max_active_tasks=1):
    search_for_canaries()
