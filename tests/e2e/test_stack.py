"""Smoke test of the harness itself: a real Airflow queues work, the real Python
edge worker runs it, and the REST API shows states, worker hostname and pushed logs."""

from __future__ import annotations

import os
import stat

import requests

from harness.airflow_client import wait_counts
from harness.procs import wait_for

MARKER = "astro-e2e marker"


def test_stack_exposes_what_workers_need(airflow):
    assert requests.get(f"{airflow.edge_api_url}/health", timeout=30).json() == {"status": "healthy"}
    assert requests.get(f"{airflow.api_base}/api/v2/monitor/health", timeout=30).status_code == 200
    assert requests.get(f"{airflow.execution_api_url}health", timeout=30).json() == {"status": "healthy"}
    assert len(airflow.jwt_secret) >= 64
    assert airflow.jwt_secret_file.read_text() == airflow.jwt_secret
    assert stat.S_IMODE(os.stat(airflow.jwt_secret_file).st_mode) == 0o600
    assert airflow.postgres_url.startswith("postgres://airflow:")
    assert (airflow.airflow_bin_dir / "airflow").exists()

    env = airflow.worker_env("smoke")
    assert env["PATH"].split(":")[0] == str(airflow.airflow_bin_dir)
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(airflow.dags_folder)
    assert env["AIRFLOW__LOGGING__BASE_LOG_FOLDER"] != str(airflow.log_folder)
    leaked = [k for k, v in env.items() if airflow.jwt_secret in v or "SQL_ALCHEMY" in k or "JWT" in k]
    assert leaked == []


def test_queue_counts_then_python_worker_runs_everything(airflow, trigger_dag, python_edge_worker):
    client = airflow.client
    run_id = trigger_dag("e2e_short_40")

    # Nothing serves `default` yet: all 40 end up queued and stay there.
    wait_counts(client, "default", {"queued": 40, "running": 0}, timeout=60)
    assert client.count("default", ["scheduled", "queued"], dag_id="e2e_short_40", run_id=run_id) == 40
    # Counts are per queue: none of this run on another (tests side by side may queue there).
    assert client.count("sentinel", ["queued"], dag_id="e2e_short_40", run_id=run_id) == 0

    worker = python_edge_worker(name="py-smoke", queues=["default"], concurrency=8)
    assert client.wait_run("e2e_short_40", run_id, timeout=300) == "success"

    tis = client.task_instances("e2e_short_40", run_id)
    assert len(tis) == 40
    assert {ti["state"] for ti in tis} == {"success"}
    assert {ti["hostname"] for ti in tis} == {"py-smoke"}
    assert client.count("default", ["queued", "running"]) == 0

    # Logs reach the api-server only through the Edge API's logs/push, which the Python worker
    # sends on its own schedule: the state may be `success` before the last chunk has arrived.
    marker = f"{MARKER} dag=e2e_short_40 task=t07 run={run_id} try=1 map=-1"
    wait_for(lambda: marker in client.task_log_text("e2e_short_40", run_id, "t07"), 60,
             "the Python worker's pushed log of t07 to reach the api-server",
             on_timeout=lambda: client.task_log_text("e2e_short_40", run_id, "t07")[-2000:])

    assert worker.stop() == 0
    assert client.edge_worker("py-smoke")["state"] == "offline"
