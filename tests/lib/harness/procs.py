"""Small process and polling helpers shared by the whole harness.

Every long-running process a test starts goes through :class:`Daemon`: it runs in
its own process group (its own session, so a Ctrl-C in the terminal does not
reach it and stopping it also stops its children), its PID is recorded, and its
stdout/stderr go to one log file whose tail is put into error messages.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping, Protocol, Sequence, TypeVar

T = TypeVar("T")


class StartupError(RuntimeError):
    """A process did not come up; the message carries the tail of its log."""


class Stack(Protocol):
    """Processes started in steps and stopped together: the Airflow stack, the control plane."""

    timings: dict[str, float]

    def stop(self) -> None: ...


@contextlib.contextmanager
def starting(stack: Stack) -> Iterator[Callable[[str], None]]:
    """The start-up of ``stack``: ``mark(step)`` records in ``stack.timings`` the seconds since
    the previous mark (or the start), ``total`` is recorded when every step is done, and a step
    that raises stops whatever the stack had started before the error goes on."""
    started = last = time.monotonic()

    def mark(step: str) -> None:
        nonlocal last
        now = time.monotonic()
        stack.timings[step] = now - last
        last = now

    try:
        yield mark
    except BaseException:
        stack.stop()
        raise
    stack.timings["total"] = time.monotonic() - started


@contextlib.contextmanager
def apt_lock() -> Iterator[None]:
    """Held while the harness runs apt: the e2e stage's tests run side by side (xdist), and a
    second ``apt-get update`` or ``install`` at the same time fails on apt's own lock. Whoever
    waited here checks again for what it was about to install."""
    folder = Path(os.environ.get("ASTRO_CACHE_DIR") or Path.home() / ".cache" / "astro-agent")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path | str, lines: int = 60) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def wait_for(
    condition: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.25,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy; return that value.

    Raises ``TimeoutError`` naming ``what`` after ``timeout`` seconds. Exceptions
    raised by ``condition`` propagate (a dead daemon should fail fast, not time
    out). ``on_timeout`` may return extra text for the error message.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = on_timeout() if on_timeout else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{extra}" if extra else ""))
        time.sleep(interval)


class Daemon:
    """One background process in its own process group, logging to a file.

    ``start()`` launches it. ``stop()`` sends ``sig`` (SIGTERM by default) to the
    leader only — as Kubernetes signals a container's PID 1, and so that a worker's
    task processes are not signalled behind its back — waits up to ``timeout``
    seconds for the leader to exit, then SIGKILLs whatever is left of the group.
    ``stop()`` is idempotent.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_file: Path,
        cwd: Path | str | None = None,
    ):
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_file = Path(log_file)
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        """PID of the process (also its process-group id), None before start."""
        return self.proc.pid if self.proc else None

    def start(self) -> "Daemon":
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.name} is already running (pid {self.proc.pid})")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            log.write(f"---- starting {self.name}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise :class:`StartupError` with the log tail if the process has exited."""
        if self.proc is None:
            raise StartupError(f"{self.name} was never started")
        code = self.proc.poll()
        if code is not None:
            raise StartupError(f"{self.name} exited with code {code}; log {self.log_file}:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        return log_tail(self.log_file, lines)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the leader only (not the group)."""
        if self.alive():
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        """Wait for the leader to exit; return its exit code (TimeoutExpired on timeout)."""
        return self.proc.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Stop the process group; return the leader's exit code (None if never started)."""
        if self.proc is None:
            return None
        pgid = self.proc.pid
        if self.proc.poll() is None:
            try:
                os.kill(pgid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _killpg(pgid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # Children that outlived their leader (e.g. task supervisors) still carry
        # the group id: give them a short grace period, then kill them.
        deadline = time.monotonic() + 5
        while _group_exists(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_exists(pgid):
            _killpg(pgid, signal.SIGKILL)
        return self.proc.returncode


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rss_mb(pid: int) -> tuple[float, float]:
    """The process's resident memory now and at its peak (``VmRSS``, ``VmHWM``), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    kb = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
          if line.startswith(("VmRSS:", "VmHWM:"))}
    return kb["VmRSS"] / 1024, kb["VmHWM"] / 1024
