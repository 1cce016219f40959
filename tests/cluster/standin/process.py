"""Container processes: started through ``exec_step.py`` in the Pod's network namespace and new
mount and UTS namespaces, found and killed through their mount namespace."""

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


def processes_in_mount_ns(inode: int) -> list[int]:
    """Every live process in one mount namespace: a container's processes, whatever their parent,
    session or process group (zombies have left their namespaces and do not count)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(f"/proc/{entry.name}/ns/mnt").st_ino == inode:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


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
    """One run of a container: its main process (the PID that gets signalled, the child that gets
    reaped) and its mount namespace, which tells the rest of its processes."""

    def __init__(self, popen: subprocess.Popen[bytes], mntns: int | None, start_error: str | None,
                 image_id: str, env: dict[str, str], cwd: str) -> None:
        self.popen, self.pid, self.mntns, self.start_error = popen, popen.pid, mntns, start_error
        self.pidfd = os.pidfd_open(popen.pid)
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
        with self._lock:
            if not self.done.is_set():
                try:
                    signal.pidfd_send_signal(self.pidfd, sig)
                except ProcessLookupError:
                    pass

    def kill_all(self) -> None:
        """SIGKILL the main process and every process left in the container's mount namespace."""
        self.signal(signal.SIGKILL)
        if self.mntns is not None and self.mntns != os.stat("/proc/self/ns/mnt").st_ino:
            for _ in range(10):  # processes may still be forking: sweep until the namespace is empty
                pids = processes_in_mount_ns(self.mntns)
                if not pids:
                    break
                kill_and_wait(pids)

    def finish(self, returncode: int) -> None:
        self.exit_code = 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128+N
        self.finished_at, self.finished_mono = time.time(), time.monotonic()
        with self._lock:
            os.close(self.pidfd)
            self.done.set()

    def terminated(self) -> Obj:
        state = {"exitCode": self.exit_code,
                 "reason": "StartError" if self.start_error else ("Completed" if self.exit_code == 0 else "Error"),
                 "startedAt": rfc3339(self.started_at), "finishedAt": rfc3339(self.finished_at),
                 "containerID": self.container_id}
        if self.start_error:
            state["message"] = self.start_error
        return state


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
    """Start a container process in a Pod's network namespace, in new mount and UTS namespaces:
    ``nsenter`` and ``unshare`` exec each other and then the in-namespace step, which execs the
    command, so the PID returned is the container's main process. The step reports the mount
    namespace it made (and any error) on a close-on-exec pipe: EOF means the command runs."""
    read_fd, write_fd = os.pipe()
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        popen = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{netns}", "--", "unshare", "--mount", "--uts", "--propagation", "private",
             "--", sys.executable, "-I", "-S", str(EXEC_STEP), str(write_fd)],
            stdin=subprocess.PIPE, stdout=out, stderr=out, pass_fds=(write_fd,), start_new_session=True,
            env={"PATH": DEFAULT_PATH}, cwd="/")
    finally:
        os.close(write_fd)
        os.close(out)
    assert popen.stdin is not None
    try:
        popen.stdin.write(json.dumps(spec).encode())
        popen.stdin.close()
    except BrokenPipeError:
        pass  # it died before reading: the report below says why
    report = _read_until_eof(read_fd, timeout=30)
    os.close(read_fd)
    mntns, error = None, None
    if report is None:
        popen.kill()
        error = "the container's namespaces could not be set up within 30 s"
    else:
        for line in report.splitlines():
            word, _, rest = line.partition(" ")
            if word == "mntns":
                mntns = int(rest)
            elif word == "error":
                error = rest
        if mntns is None and error is None:
            error = f"the container's namespaces could not be entered (see {log_path})"
    return Process(popen, mntns, error, image_id, spec["env"], spec["cwd"])
