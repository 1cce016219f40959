"""astro-agent's pre-forked task launcher.

The agent starts this file once with the Python that runs tasks. It imports Airflow's task SDK
supervisor code up front (the slow part of starting a task), then for every job the agent
sends it forks a process that runs the task exactly as
``python -m airflow.sdk.execution_time.execute_workload --json-path FILE`` would.

Protocol (stdin/stdout of this process): each message is a 4-byte big-endian length followed by
that many bytes of JSON.
  launcher -> agent, once:  {"ready": true, "pid": <launcher pid>}
  agent -> launcher:        {"id", "workload", "output", "claim"}   (paths)
  launcher -> agent:        {"id", "pid": <task pid>}  or  {"id", "error": "<text>"}

Each task is started by a double fork, so that it is not this launcher's child: it is
re-parented to the agent (a child subreaper), which waits for it and learns its exit status even
if this launcher dies. Before running, the task creates ``claim`` exclusively and writes its pid
there: if the agent has already claimed the job (because the launcher stopped answering and the
agent started the task another way), the task exits without running, so no job runs twice.
"""

import importlib
import json
import os
import signal
import struct
import sys
import traceback


def _read_message(stream):
    header = stream.read(4)
    if len(header) < 4:
        return None
    (length,) = struct.unpack(">I", header)
    body = stream.read(length)
    if len(body) < length:
        return None
    return json.loads(body)


def _write_message(stream, message):
    body = json.dumps(message).encode()
    stream.write(struct.pack(">I", len(body)) + body)
    stream.flush()


def _run_task(request):
    """In the task process: become a process group, claim the job, run the supervisor."""
    code = 1
    try:
        os.setpgid(0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        try:
            claim = os.open(request["claim"], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            os._exit(0)  # the agent took this job back; it runs elsewhere
        os.write(claim, str(os.getpid()).encode())
        os.close(claim)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        output = os.open(request["output"], os.O_WRONLY | os.O_APPEND)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(null)
        os.close(output)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        sys.argv = ["execute_workload", "--json-path", request["workload"]]
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


def _launch(request):
    """Double-fork the task; return its pid once the intermediate process has exited."""
    read_end, write_end = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        try:
            os.close(read_end)
            task = os.fork()
            if task == 0:
                os.close(write_end)
                _run_task(request)
            os.write(write_end, str(task).encode())
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
        raise RuntimeError("the intermediate process died before reporting the task's pid")
    return int(b"".join(chunks))


def main():
    # The agent owns our lifetime (we exit when it closes stdin); terminal signals are not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    # Keep stray prints of imported modules out of the protocol stream.
    sys.stdout = sys.stderr

    # What execute_workload imports on its way to the supervisor, loaded once here.
    import pydantic  # noqa: F401
    from airflow.executors import workloads  # noqa: F401
    from airflow.executors.base_executor import BaseExecutor  # noqa: F401
    from airflow.sdk.execution_time import execute_workload, supervisor  # noqa: F401
    from airflow.sdk.log import configure_logging  # noqa: F401

    # Also warm what every task imports on its way, when installed: the hostname callable the
    # agent sets (the edge provider's worker module) and the DAG bag. A missing one only
    # costs the task its import time.
    for optional in ("airflow.providers.edge3.cli.worker", "airflow.dag_processing.dagbag"):
        try:
            importlib.import_module(optional)
        except Exception:  # noqa: BLE001
            pass

    _write_message(replies, {"ready": True, "pid": os.getpid()})
    while True:
        request = _read_message(requests)
        if request is None:
            return
        try:
            _write_message(replies, {"id": request["id"], "pid": _launch(request)})
        except Exception as e:  # noqa: BLE001 - every failure goes back to the agent
            _write_message(replies, {"id": request.get("id"), "error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
