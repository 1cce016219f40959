"""Container processes: started through ``exec_step.py`` in the Pod's network namespace and new
mount, UTS and PID namespaces, signalled through the init (PID 1) of their PID namespace."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from standin.common import DEFAULT_PATH, rfc3339

if TYPE_CHECKING:
    from standin.common import Obj


EXEC_STEP = Path(__file__).resolve().with_name("exec_step.py")  # standalone: see its docstring


def kill_and_wait(pids: list[int], timeout: float = 10.0) -> None:
    """SIGKILL processes and wait until they are gone (through pidfds, so no PID is ever reused
    under us and nothing polls)."""
    fds = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            fds.append(fd)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while fds and time.monotonic() < deadline:
        ready, _, _ = select.select(fds, [], [], deadline - time.monotonic())
        for fd in ready:
            fds.remove(fd)
            os.close(fd)
    for fd in fds:
        os.close(fd)


class Process:
    """One run of a container: its shim (the stand-in's child, reaped here; its exit status is the
    container's) and its init (PID 1 of the container's PID namespace, the process that gets
    signalled). The shim exits only after the init, and the kernel ends the rest of the namespace
    before that: ``done`` means nothing of the run is left."""

    def __init__(self, shim: subprocess.Popen[bytes], init_pid: int | None, start_error: str | None,
                 image_id: str, env: dict[str, str], cwd: str) -> None:
        self.shim, self.start_error = shim, start_error
        self.init_pidfd = _pidfd_of_child(init_pid, shim.pid) if init_pid is not None else None
        self.pid = init_pid if self.init_pidfd is not None else shim.pid  # as logged, and for nsenter
        self.image_id, self.env, self.cwd = image_id, env, cwd
        self.started_at = time.time()
        self._lock = threading.Lock()  # signal() never races finish() closing the pidfd
        self.finished_at = 0.0
        self.finished_mono = 0.0
        self.exit_code = 0
        self.done = threading.Event()

    @property
    def container_id(self) -> str:
        return f"standin://{self.pid}"

    def signal(self, sig: int) -> None:
        """Signal the init, as a runtime does: as PID 1 of its namespace it only gets the signals
        it handles, and SIGKILL."""
        with self._lock:
            if not self.done.is_set() and self.init_pidfd is not None:
                try:
                    signal.pidfd_send_signal(self.init_pidfd, sig)
                except ProcessLookupError:
                    pass

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILL the init, which takes every process of its namespace with it, and wait until it
        is gone; without an init (its setup failed) the shim goes, and its child with it."""
        with self._lock:
            if self.done.is_set():
                return
            pidfd = os.dup(self.init_pidfd) if self.init_pidfd is not None else None
        if pidfd is None:
            try:
                self.shim.kill()
            except ProcessLookupError:
                pass
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            select.select([pidfd], [], [], timeout)  # readable once it has exited
        finally:
            os.close(pidfd)

    def finish(self, returncode: int) -> None:
        self.exit_code = 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128+N
        self.finished_at, self.finished_mono = time.time(), time.monotonic()
        with self._lock:
            if self.init_pidfd is not None:
                os.close(self.init_pidfd)
            self.done.set()

    def terminated(self) -> Obj:
        state = {"exitCode": self.exit_code,
                 "reason": "StartError" if self.start_error else ("Completed" if self.exit_code == 0 else "Error"),
                 "startedAt": rfc3339(self.started_at), "finishedAt": rfc3339(self.finished_at),
                 "containerID": self.container_id}
        if self.start_error:
            state["message"] = self.start_error
        return state


def _pidfd_of_child(pid: int, parent: int) -> int | None:
    """A pidfd of ``pid`` if it still is ``parent``'s child: the shim never forks twice, so a
    process of that PID with another parent is a stranger that got the PID of an init that has
    already ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        ppid = -1
    if ppid != parent:
        os.close(fd)
        return None
    return fd


def _read_until_eof(fd: int, timeout: float) -> str | None:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                return b"".join(chunks).decode(errors="replace")
            chunks.append(chunk)
    return None


def spawn_container(netns: str, spec: Obj, log_path: Path, image_id: str) -> Process:
    """Start a container in a Pod's network namespace, in new mount, UTS and PID namespaces:
    ``nsenter`` execs the shim (``exec_step.py``), which forks the init, which execs the command.
    The shim reports the init's PID (and any error) on a close-on-exec pipe: EOF means the command
    runs."""
    read_fd, write_fd = os.pipe()
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        shim = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{netns}", "--", sys.executable, "-I", "-S", str(EXEC_STEP), str(write_fd)],
            stdin=subprocess.PIPE, stdout=out, stderr=out, pass_fds=(write_fd,), start_new_session=True,
            env={"PATH": DEFAULT_PATH}, cwd="/")
    finally:
        os.close(write_fd)
        os.close(out)
    assert shim.stdin is not None
    try:
        shim.stdin.write(json.dumps(spec).encode())
        shim.stdin.close()
    except BrokenPipeError:
        pass  # it died before reading: the report below says why
    report = _read_until_eof(read_fd, timeout=30)
    os.close(read_fd)
    init_pid, error = None, None
    if report is None:
        shim.kill()
        error = "the container's namespaces could not be set up within 30 s"
    else:
        for line in report.splitlines():
            word, _, rest = line.partition(" ")
            if word == "init":
                init_pid = int(rest)
            elif word == "error":
                error = rest
        if init_pid is None and error is None:
            error = f"the container's namespaces could not be entered (see {log_path})"
    return Process(shim, init_pid, error, image_id, spec["env"], spec["cwd"])
