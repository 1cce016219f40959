"""astro-agent's pre-forked task launcher.

The agent's task host starts this script once with the Python that runs tasks. It imports
Airflow's task SDK supervisor code up front (the slow part of starting a task), then for every
job the task host sends it forks a process that runs the task exactly as
``python -m airflow.sdk.execution_time.execute_workload --json-path FILE`` would — except that
the supervisor notices the end of its task without waiting for its next heartbeat (see
``_wake_selects_on_child_exit``).

Usage: ``python -c SOURCE astro-launcher [SPARES]`` (the most spares it keeps; default 1),
started by the agent's task host; or ``python -c SOURCE astro-launcher --one`` for one task in a
fresh interpreter (it writes one byte once it is not dumpable, then reads its request). The
source travels in argv, never in a file: tasks run as the task host's user and could rewrite a
file, or drop a module beside it that Python would import first; argv is fixed at exec. For the
same reason the current folder, which ``-c`` puts first on ``sys.path``, is taken off it before
anything is imported (see the first lines below).

Protocol (stdin/stdout of this process, both one end of a Unix socket pair: unlike a pipe, a
socket cannot be opened again through ``/proc/<pid>/fd`` by a task that is quick enough to catch
this process before it is not dumpable): each message is a 4-byte big-endian length followed by
that many bytes of JSON.
  launcher -> host, once:   {"type": "ready"}
  launcher -> host:         {"type": "spare", "pid": <pid>}   as soon as that process exists
                            (see below)
  host -> launcher:         one byte carrying the task's link (SCM_RIGHTS), then
                            {"id", "host": <task host pid>, "workload": {...}}
  launcher -> host:         {"type": "started", "id", "pid": <task pid>}
                        or  {"type": "failed", "id", "error": "<text>"}

The workload holds the task's Execution API token. Tasks run as the same user as this launcher,
so the launcher, its spares and the supervisors it starts are not dumpable: no task can read
another's token through ``/proc/<pid>/mem``, ``environ`` or ``fd``. The workload reaches the
supervisor in memory, never in a file or in argv.

Each task process is made by a double fork, so that it is not this launcher's child: it is
re-parented to the task host (a child subreaper), which waits for it and learns its exit status even
if this launcher dies. The launcher makes them ahead of time, while it has nothing else to do:
processes wait, each on its own pipe, for a job, so that starting a task costs no fork while the
machine is busiest (when tasks end and the next ones start). How many follows demand
(``SpareDemand``): as many as the largest burst of starts in the last few minutes, at most
SPARES, and none on an idle worker, whose memory they would only take. A spare whose pipe
closes (the launcher is gone, or it is no longer wanted) exits; the task host waits for it like
for a task, which is why each is announced. The task's link to the task host, one end of a
Unix socket pair, becomes its stdout and stderr; before running, the task claims the job on it:
it writes its pid and waits for the task host's answer. The task host answers only the task it
adopts: one whose link closes unanswered (the launcher stopped answering, and the task host
started the job another way) exits without running, so no job runs twice. A task dies with the
task host (``PR_SET_PDEATHSIG``), whose end is the end of the tasks it reports on.
"""

import sys

# ``-c`` put the current folder first on sys.path, where a task (same user) may have dropped a
# module named like one imported below: off it goes before the first import from the path.
if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]

import collections  # noqa: E402 - after the path is safe
import ctypes
import gc
import importlib
import json
import os
import select
import selectors
import signal
import socket
import struct
import time
import traceback

#: The name under which the launcher's tasks can import this file (it runs as ``__main__``).
LAUNCHER_MODULE = "astro_launcher"
#: How often an empty selector looks for an exited child (see _wake_selects_on_child_exit).
CHILD_EXIT_POLL = 0.005
#: How long no request must arrive before the launcher makes spares; also the gap that ends a
#: burst of starts.
SPARE_AFTER_QUIET = 1.0
#: How long a burst of starts keeps its spares wanted. Tasks of a DAG run start in waves a few
#: seconds to minutes apart; a worker idle for longer than this holds no spares.
DEMAND_WINDOW = 180.0


class SpareDemand:
    """How many spares are worth keeping: the size of the largest burst of starts (requests
    closer than ``SPARE_AFTER_QUIET`` to each other) that ended within ``DEMAND_WINDOW``, at most
    ``most``. None before the first start: a worker that never ran a task keeps none."""

    def __init__(self, most, clock=time.monotonic):
        self.most = most
        self._clock = clock
        self._bursts = collections.deque()  # [last start, size], oldest first

    def started(self):
        now = self._clock()
        if self._bursts and now - self._bursts[-1][0] < SPARE_AFTER_QUIET:
            self._bursts[-1][0] = now
            self._bursts[-1][1] += 1
        else:
            self._bursts.append([now, 1])

    def wanted(self):
        self._forget_old()
        return min(self.most, max((size for _, size in self._bursts), default=0))

    def seconds_to_next_change(self):
        """When ``wanted`` may drop next (the oldest burst leaves the window); None if never."""
        self._forget_old()
        if not self._bursts:
            return None
        return max(0.0, self._bursts[0][0] + DEMAND_WINDOW - self._clock())

    def _forget_old(self):
        horizon = self._clock() - DEMAND_WINDOW
        while self._bursts and self._bursts[0][0] <= horizon:
            self._bursts.popleft()


#: The launcher's ends of the spares' job sockets. Only the launcher may hold them: a spare
#: must see its socket close when the launcher is gone, so every process forked from the
#: launcher closes them.
_spare_pipes = []


def _close_spare_pipes():
    for hand in _spare_pipes:
        hand.close()
    _spare_pipes.clear()


def _read_exactly(fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _read_message(fd):
    header = _read_exactly(fd, 4)
    if header is None:
        return None
    (length,) = struct.unpack(">I", header)
    body = _read_exactly(fd, length)
    return None if body is None else json.loads(body)


def _write_message(fd, message):
    body = json.dumps(message).encode()
    frame = struct.pack(">I", len(body)) + body
    while frame:
        frame = frame[os.write(fd, frame):]


def _wake_selects_on_child_exit():
    """Makes Airflow's supervisor notice at once that its task process has ended.

    The supervisor reads the task's sockets until they all close, then checks once whether the
    task process has exited. The task closes its sockets a moment before it is gone, so that
    check can come too early; the supervisor then waits in ``select`` on a selector with nothing
    left to watch until its next heartbeat ([workers] min_heartbeat_interval, 5 s), and the slot
    stays taken. Here ``select`` on an empty selector also returns (with no events, as on a
    timeout) as soon as a child process has exited, so the supervisor's next check finds it.
    Only the supervisor's own process has this: processes it forks (the task) get the
    original ``select`` back.
    """
    selector_class = selectors.DefaultSelector
    original = selector_class.select
    last_woken_by = [None]  # a zombie the caller does not reap must not wake us again

    def select(self, timeout=None):
        if self.get_map() or (timeout is not None and timeout <= 0):
            return original(self, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # no child at all: nothing to wake up for
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                return original(self, remaining)
            if exited is not None and exited.si_pid != last_woken_by[0]:
                last_woken_by[0] = exited.si_pid
                return []
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return []
            time.sleep(CHILD_EXIT_POLL if remaining is None else min(CHILD_EXIT_POLL, remaining))

    selector_class.select = select
    os.register_at_fork(after_in_child=lambda: setattr(selector_class, "select", original))


#: prctl(2) options.
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


def _prctl(option, value):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


def _make_undumpable():
    """Closes this process's memory, environment and descriptors to the tasks (same user):
    forks keep it; the supervisors started from here hold workloads with tokens."""
    _prctl(PR_SET_DUMPABLE, 0)


def _die_with_host(host):
    """Dies when the task host does: waits until this process is the task host's (a double
    fork's intermediate process may not have exited yet), then asks for SIGKILL on its end."""
    while os.getppid() != host:
        if os.getppid() == 1 and host != 1:
            os._exit(1)  # the task host is gone already
        time.sleep(0.001)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != host:
        os._exit(1)


#: Airflow's setting for the function that names the host a task ran on.
HOSTNAME_CALLABLE = "AIRFLOW__CORE__HOSTNAME_CALLABLE"
#: The process that becomes the task's supervisor (set in each task process of the launcher).
_supervisor_pid = None
#: The hostname callable the user configured (None: Airflow's default), for processes that are
#: not forked from the launcher.
_importable_hostname_callable = None


def task_hostname():
    """Airflow's hostname callable in the launcher's tasks: the worker's name (HOSTNAME), as the
    edge provider's ``_edge_hostname`` answers — without that provider, which the tasks' image
    need not have.

    The task process (a fork of the supervisor) hands its own children the callable the user
    configured (or none: Airflow's default) again: they are fresh interpreters, where this
    launcher is not importable. It does so on its first call, which Airflow's task runner makes
    before any task code runs (it sets ``ti.hostname`` while preparing the task).
    """
    if os.getpid() != _supervisor_pid:
        if _importable_hostname_callable is None:
            os.environ.pop(HOSTNAME_CALLABLE, None)
        else:
            os.environ[HOSTNAME_CALLABLE] = _importable_hostname_callable
    return os.environ.get("HOSTNAME") or socket.getfqdn()


def _run_task(request, link=None):
    """In the task process: become a process group, claim the job on ``link`` (the task's link
    to the task host, a socket; None in a fresh interpreter, whose stdout and stderr it is
    already, and which the task host started for this one job), run the supervisor."""
    code = 1
    try:
        os.setpgid(0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        if request.get("host"):
            _die_with_host(request["host"])
        if link is not None and not _claim(link):
            os._exit(0)  # the task host took this job back; it runs elsewhere
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        if link is not None:
            os.dup2(link, 1)
            os.dup2(link, 2)
            os.close(link)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        # In memory: argv here is this process's Python list, not its /proc cmdline.
        sys.argv = ["execute_workload", "--json-string", json.dumps(request["workload"])]
        global _supervisor_pid, _importable_hostname_callable
        _supervisor_pid = os.getpid()
        _importable_hostname_callable = os.environ.get(HOSTNAME_CALLABLE)
        os.environ[HOSTNAME_CALLABLE] = f"{LAUNCHER_MODULE}.task_hostname"
        _wake_selects_on_child_exit()
        from airflow.sdk.execution_time import execute_workload

        execute_workload.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _claim(link):
    """Whether the task host lets this process run the job: it is told this pid, and answers."""
    try:
        os.write(link, struct.pack(">i", os.getpid()))
        return os.read(link, 1) == b"!"
    except OSError:
        return False


def _double_fork(body):
    """Runs ``body()`` in a grandchild, re-parented to the task host once the intermediate process
    has exited; returns the grandchild's pid."""
    read_end, write_end = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        try:
            os.close(read_end)
            grandchild = os.fork()
            if grandchild == 0:
                try:
                    os.close(write_end)
                    body()
                finally:
                    # body() exits by itself once the task has taken over: getting here is a
                    # failure, which the task host (waiting for this pid) must see as one.
                    os._exit(1)
            os.write(write_end, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 64)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(intermediate, 0)
    if not chunks:
        raise RuntimeError("the intermediate process died before reporting the new process's pid")
    return int(b"".join(chunks))


def _receive(channel):
    """The next request on ``channel`` (a socket) and the task's link that comes before it;
    (None, None) once the channel has closed."""
    data, links, _, _ = socket.recv_fds(channel, 1, 1)
    if not data:
        return None, None
    request = _read_message(channel.fileno())
    if not links:
        raise RuntimeError("a request came without the task's link")
    return request, links[0]


def _send(channel, request, link):
    """Sends ``request`` with ``link`` on ``channel``, as the task host sends them to us."""
    socket.send_fds(channel, [b"f"], [link])
    _write_message(channel.fileno(), request)


def _spare(jobs):
    """In a spare: wait for one job on the ``jobs`` socket and run it; exit once it closes."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # the protocol socket is the launcher's, not ours
    os.dup2(null, 1)
    os.close(null)
    try:
        request, link = _receive(jobs)
    except (OSError, RuntimeError):
        os._exit(0)
    if request is None:
        os._exit(0)
    jobs.close()
    _run_task(request, link)


def _make_spare():
    """A process waiting for a job, and the socket that hands it one."""
    jobs, hand = socket.socketpair()

    def body():
        hand.close()
        _spare(jobs)

    try:
        pid = _double_fork(body)
    except BaseException:
        hand.close()
        raise
    finally:
        jobs.close()
    return pid, hand


def _hand_to_spare(spares, request, link):
    """Gives ``request`` and its ``link`` to a waiting spare; its pid, or None when none could
    take it."""
    while spares:
        pid, hand = spares.pop(0)
        _spare_pipes.remove(hand)
        try:
            _send(hand, request, link)
            return pid
        except OSError:
            continue  # it died while waiting (the task host has reaped it): try the next one
        finally:
            hand.close()
    return None


def _quiet_for(fd, seconds):
    """Whether nothing arrives on ``fd`` for ``seconds`` (None: until something does)."""
    return not select.select([fd], [], [], seconds)[0]


def _retire_spare(spares):
    """Lets the newest spare go: its socket closes, so it exits (and the task host reaps it)."""
    _, hand = spares.pop()
    _spare_pipes.remove(hand)
    hand.close()


def _warm_up():
    """Loads once what every task needs on its way, so that each fork finds it ready.

    Best effort: a step that fails (an older Airflow, a provider not installed) only costs each
    task that step's time, as in a fresh interpreter.
    """
    steps = (
        # The DAG bag, which parses the task's DAG file.
        lambda: importlib.import_module("airflow.dag_processing.dagbag"),
        # What DAG files take from the SDK; its names are loaded lazily on first use (~40 ms).
        lambda: [getattr(importlib.import_module("airflow.sdk"), n) for n in ("DAG", "task", "BaseOperator")],
        # The Execution API client's TLS context, built once per process (~50 ms) and cached.
        _warm_execution_api_client,
    )
    for step in steps:
        try:
            step()
        except Exception:  # noqa: BLE001
            pass


def _warm_execution_api_client():
    from airflow.sdk.api.client import Client

    Client(base_url="http://127.0.0.1/", token="").close()


def run_one():
    """A fresh interpreter's one task: its request arrives on stdin (a socket) once it has said
    it is not dumpable."""
    _make_undumpable()
    os.write(0, b"!")
    request = _read_message(0)
    if request is None:
        os._exit(1)
    sys.modules[LAUNCHER_MODULE] = sys.modules[__name__]
    _run_task(request)


def main():
    args = sys.argv[2:]  # after "-c" and the name "astro-launcher"
    if args == ["--one"]:
        run_one()
    _make_undumpable()
    spare_count = int(args[0]) if args else 1
    # The task host owns our lifetime (we exit when it closes stdin); terminal signals are not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    requests, replies = 0, 1
    # Over fd 0 itself, no copy of it: every process forked from here replaces fd 0, and a copy
    # would reach the tasks, which could then read other tasks' requests.
    channel = socket.socket(fileno=requests)
    # Keep stray prints of imported modules out of the protocol stream.
    sys.stdout = sys.stderr
    os.register_at_fork(after_in_child=_close_spare_pipes)
    # Tasks name this module in their hostname callable (see task_hostname).
    sys.modules[LAUNCHER_MODULE] = sys.modules[__name__]

    # What execute_workload imports on its way to the supervisor, loaded once here. The cyclic
    # collector would otherwise sweep the imports' ever-growing heap of long-lived objects over
    # and over (about a fifth of their CPU time, on the way to a new worker's first task); it is
    # back on before any task is forked.
    gc.disable()
    import pydantic  # noqa: F401
    from airflow.executors import workloads  # noqa: F401
    from airflow.executors.base_executor import BaseExecutor  # noqa: F401
    from airflow.sdk.execution_time import execute_workload, supervisor  # noqa: F401
    from airflow.sdk.log import configure_logging  # noqa: F401

    gc.enable()

    _write_message(replies, {"type": "ready"})
    warmed = False
    spares = []
    demand = SpareDemand(spare_count)
    while True:
        # The warm-up waits until no request does: a new worker's first job is often waiting
        # already, and its task process loads what it needs itself, after its start is recorded.
        if not warmed and _quiet_for(requests, 0):
            _warm_up()
            warmed = True
        while len(spares) > demand.wanted():
            _retire_spare(spares)
        # Make spares once requests have stopped coming for a moment: tasks start in bursts
        # (several end at once and their slots refill), and a fork then would take CPU from the
        # tasks starting; a request never waits for a fork it does not need.
        while len(spares) < demand.wanted() and _quiet_for(requests, SPARE_AFTER_QUIET):
            try:
                pid, hand = _make_spare()
            except OSError as e:
                print(f"astro-agent launcher: could not make a spare process: {e}", file=sys.stderr)
                break
            spares.append((pid, hand))
            _spare_pipes.append(hand)
            _write_message(replies, {"type": "spare", "pid": pid})
        # Wake up when demand lapses, to let go of the spares no longer wanted.
        if spares and _quiet_for(requests, demand.seconds_to_next_change()):
            continue
        request, link = _receive(channel)
        if request is None:
            return
        demand.started()
        try:
            pid = _hand_to_spare(spares, request, link)
            if pid is None:
                pid = _double_fork(lambda: _run_task(request, link))
            _write_message(replies, {"type": "started", "id": request["id"], "pid": pid})
        except Exception as e:  # noqa: BLE001 - every failure goes back to the task host
            error = f"{type(e).__name__}: {e}"
            _write_message(replies, {"type": "failed", "id": request.get("id"), "error": error})
        finally:
            os.close(link)  # the task has its own copy


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        # The task host closed our pipe (it stopped before we could answer): we go with it,
        # without a traceback in its log.
        os._exit(0)
