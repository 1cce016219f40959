"""Starts the cluster stage's shared infrastructure once, for several pytest processes.

    python -m infra.driver --state FILE

run inside the stage's namespace with the stage's environment (``run.sh`` does). It starts the
control plane, the Service resolver, the Nodes, KEDA (and the record of its backlog readings above
0, ``infra/idle_pools.py``) and Airflow (Airflow alongside the rest),
writes FILE (what ``stage.attach`` reads: addresses, token, ports), prints ``ready`` on stdout
and closes it, then runs until SIGTERM or SIGINT, when it stops everything it started, newest
first. If anything fails to start it stops what it had started and exits 1 without printing
``ready``: whoever reads its stdout sees the end of it instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from infra import idle_pools, stage
from infra.kube import Cluster


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state", type=Path, required=True)
    args = p.parse_args(argv)
    work, bin_dir = Path(os.environ["ASTRO_CLUSTER_WORK"]), Path(os.environ["ASTRO_CLUSTER_BIN"])
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
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
        stage.write_state(args.state, stage.state(control_plane, keda, airflow["stack"]))
        print("shared infrastructure ready", flush=True)
        ready_out.write("ready\n")
        ready_out.close()
        stop.wait()
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
