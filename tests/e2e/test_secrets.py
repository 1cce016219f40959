"""No task can read the worker's secrets.

Tasks run as the agent's user. The agent gets Airflow's JWT secret (which signs every task's
Execution API token) and a REST API credential; a real Airflow task on the agent searches
every place a process of that user can read for them (see ``dags/e2e_canary.py``): the
``environ`` and ``cmdline`` of PID 1, the agent and every process below it (the pre-fork
launcher, spares, task supervisors, the task itself), the agent's open files, and the
agent's work, log and home folders. The secrets are given the way the chart gives them
(files) and the way a local run may (environment variables); in both launch modes.

What is not searched: the secret files themselves. A process of the same user can open a
file the agent can open; the README says so, and what to do about it.

Run as root, the test starts the agent as an unprivileged user (nobody), as the Airflow image
runs it (uid 50000): root reads every process's /proc files whatever the agent does. It keeps
CAP_DAC_READ_SEARCH (ambient, so its tasks have it too) to reach the Airflow venv in root's
cache; that capability bypasses file modes, not the ptrace checks that guard /proc.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from harness.astro_agent_process import AstroAgent

DAG = "e2e_canary"


def _write_secret(path: Path, value: str) -> Path:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_text(value + "\n")  # as a Kubernetes Secret made with `echo` would be
    path.chmod(0o600)
    return path


NOBODY = 65534


def _as_unprivileged_user(agent: AstroAgent) -> None:
    """As root, make the agent (and so its tasks) run as nobody, owning its worker folder."""
    if os.geteuid() != 0:
        return
    for path in [agent.folder, *agent.folder.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    agent.daemon.env["HOME"] = str(agent.folder / "home")
    agent.daemon.argv = [
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--", *agent.daemon.argv,
    ]


@pytest.mark.parametrize("mode", ["prefork", "fresh"])
@pytest.mark.parametrize("given_as", ["files", "environment"])
def test_no_task_can_read_the_workers_secrets(airflow, trigger_dag, tmp_path, mode, given_as):
    jwt_secret = airflow.jwt_secret
    rest_token = airflow.new_client().login()  # a real REST API token the agent uses for queue stats
    unlisted = "unlisted-" + secrets.token_urlsafe(32)  # in the agent's env, on no allowlist

    agent = AstroAgent(airflow, f"canary-{mode}-{given_as}", queues=["canary"], sync_slots=2,
                       launch_mode=mode, queue_stats=False)
    env = agent.daemon.env
    work_parent = agent.folder / "tmp"
    work_parent.mkdir(exist_ok=True)
    env["TMPDIR"] = str(work_parent)  # the agent's work directory is made in here
    env["TEAM_API_KEY"] = unlisted
    # A worker image that shares the Airflow servers' configuration would carry this.
    env["AIRFLOW__API_AUTH__JWT_SECRET"] = jwt_secret
    env["ASTRO_AGENT_REST_API_URL"] = airflow.api_base
    if given_as == "files":
        token_file = _write_secret(tmp_path / "secrets" / "rest-api-token", rest_token)
        env["ASTRO_AGENT_REST_API_TOKEN_FILE"] = str(token_file)
        assert "ASTRO_AGENT_JWT_SECRET_FILE" in env
    else:
        del env["ASTRO_AGENT_JWT_SECRET_FILE"]
        env["ASTRO_AGENT_JWT_SECRET"] = jwt_secret
        env["ASTRO_AGENT_REST_API_TOKEN"] = rest_token
    _as_unprivileged_user(agent)

    agent.start()
    try:
        wanted = [jwt_secret, rest_token, unlisted]
        run = trigger_dag(DAG, conf={
            "reversed_canaries": [c[::-1] for c in wanted],
            "agent_pid": agent.daemon.pid,
            "folders": [str(agent.folder)],
        })
        state = airflow.client.wait_run(DAG, run, timeout=300)
        log = airflow.client.task_log_text(DAG, run, "search_for_canaries")
        assert state == "success", f"the task found a secret (or failed):\n{log[-3000:]}"
        summary = airflow.client.get(
            f"/api/v2/dags/{DAG}/dagRuns/{run}/taskInstances/search_for_canaries/xcomEntries/return_value",
            deserialize="true", stringify="false",
        )["value"]
        assert summary["found"] == []
        # The search read something: the environ of the task's own processes at least, and
        # the agent's files (its work directory with this task's workload, its log).
        assert summary["processes"] >= 2, summary
        assert summary["proc_files_read"] >= 2, summary
        assert summary["files_read"] >= 2, summary
        # The agent is not dumpable: its /proc files are closed to its tasks.
        assert summary["agent_environ"] == "unreadable", summary
        # Not one of its open files either (listing /proc/<agent>/fd only needs the file
        # mode, which this test's CAP_DAC_READ_SEARCH bypasses as root; opening needs ptrace).
        assert summary["agent_fds_opened"] == 0, summary
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(60)
        except subprocess.TimeoutExpired:
            pass
        agent.stop(timeout=30)
