"""Starts the cluster stage's shared infrastructure once, for several pytest processes.

    python -m infra.driver --state FILE

run inside the stage's namespace with the stage's environment (``run.sh`` does). It starts the
control plane, the Service resolver, the Nodes, KEDA (and the record of its backlog readings above
0, ``infra/idle_pools.py``) and Airflow (Airflow alongside the rest),
writes FILE (what ``stage.attach`` reads: addresses, token, ports), prints ``ready`` on stdout
and closes it, then runs until SIGTERM or SIGINT, when it stops everything it started, newest
first. If anything fails to start it stops what it had started and exits 1 without printing
``ready``: whoever reads its stdout sees the end of it instead.

On SIGUSR1 it performs the outage a chaos scenario asked for in the request file beside FILE
(``infra/outage.py``): it started those processes, so it alone stops and restarts them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from infra import idle_pools, outage, stage
from infra.kube import Cluster


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state", type=Path, required=True)
    args = p.parse_args(argv)
    work, bin_dir = Path(os.environ["ASTRO_CLUSTER_WORK"]), Path(os.environ["ASTRO_CLUSTER_BIN"])
    stop, asked = threading.Event(), threading.Event()
    wake = threading.Event()  # either of the two

    def on(event: threading.Event):
        return lambda *_: (event.set(), wake.set())

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on(stop))
    signal.signal(signal.SIGUSR1, on(asked))
    # Everything printed goes to stderr (the log); stdout carries "ready" only.
    ready_out, sys.stdout = sys.stdout, sys.stderr

    started: list = []  # what stops each thing started, in start order
    airflow: dict = {}

    def start_airflow() -> None:
        try:
            airflow["stack"] = stage.start_airflow(work)
        except BaseException as e:  # reported by the main thread
            airflow["error"] = e
            traceback.print_exc()

    airflow_thread = threading.Thread(target=start_airflow, name="airflow")
    airflow_thread.start()
    code = 1
    try:
        control_plane = stage.start_control_plane(work, bin_dir)
        started.append(control_plane.stop)
        cluster = Cluster(control_plane.server, str(control_plane.ca_file), control_plane.token)
        started.append(stage.start_service_hosts(work, control_plane).stop)
        nodes = stage.start_nodes(work, control_plane, cluster)
        started.append(lambda: nodes.stop(timeout=60))
        keda = stage.start_keda(work, bin_dir, control_plane)
        started.append(keda.stop)
        started.append(idle_pools.start_recording(work, keda, cluster).stop)
        airflow_thread.join()
        if "error" in airflow:
            raise RuntimeError(f"Airflow did not start: {airflow['error']}")
        started.append(airflow["stack"].stop)
        stage.write_state(args.state, stage.state(control_plane, keda, airflow["stack"]) | {"driver_pid": os.getpid()})
        print("shared infrastructure ready", flush=True)
        ready_out.write("ready\n")
        ready_out.close()
        while not stop.is_set():
            wake.wait()
            wake.clear()
            if asked.is_set() and not stop.is_set():
                asked.clear()
                _perform_outage(args.state, control_plane, keda)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        airflow_thread.join()
        if "stack" in airflow and airflow["stack"].stop not in started:
            started.append(airflow["stack"].stop)
        for stop_it in reversed(started):
            try:
                stop_it()
            except Exception as e:  # keep tearing down
                print(f"stopping: {e!r}", flush=True)
        print("shared infrastructure stopped", flush=True)
    return code


def _perform_outage(state: Path, control_plane, keda) -> None:
    """The outage the request file beside ``state`` names; the answer goes to the done file."""
    answer: dict = {}
    try:
        request = json.loads(outage.request_path(state).read_text())
        print(f"outage of {request['component']} for {request['down']} s", flush=True)
        answer["exited"] = outage.perform(control_plane, keda, request["component"], float(request["down"]))
        print(f"{request['component']} back", flush=True)
    except Exception as e:  # reported to the scenario that asked
        traceback.print_exc()
        answer["error"] = repr(e)
    done = outage.done_path(state)
    tmp = done.with_name(done.name + ".tmp")
    tmp.write_text(json.dumps(answer))
    tmp.replace(done)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
