"""astro-agent against the real Airflow 3 + Edge provider stack."""

from __future__ import annotations

import os
import signal
from datetime import datetime

import pytest

from harness.procs import wait_for

MARKER = "astro-e2e marker"
# The queues of e2e_long_8 and e2e_mapped_4 (e2e_short_40's is `default`).
LONG, MAPPED = "long", "mapped"


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def max_concurrency(task_instances: list[dict]) -> int:
    """Largest number of these task instances that were running at the same moment."""
    events = []
    for ti in task_instances:
        events.append((_ts(ti["start_date"]), 1))
        events.append((_ts(ti["end_date"]), -1))
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


LAUNCH_MODES = pytest.mark.parametrize("mode", ["prefork", "fresh"])


@LAUNCH_MODES
def test_two_agents_run_40_tasks_within_their_slots_and_ship_logs(airflow, trigger_dag, astro_agent, mode):
    a = astro_agent("agent-a", sync_slots=4, launch_mode=mode)
    b = astro_agent("agent-b", sync_slots=4, launch_mode=mode)
    run = trigger_dag("e2e_short_40")
    state = airflow.client.wait_run("e2e_short_40", run, timeout=900)
    tis = airflow.client.task_instances("e2e_short_40", run)
    assert len(tis) == 40
    assert {ti["state"] for ti in tis} == {"success"}, [(t["task_id"], t["state"]) for t in tis if t["state"] != "success"]
    assert state == "success"

    by_host: dict[str, list[dict]] = {}
    for ti in tis:
        by_host.setdefault(ti["hostname"], []).append(ti)
    assert set(by_host) == {"agent-a", "agent-b"}, f"hosts: {sorted(by_host)}"
    for host, items in by_host.items():
        peak = max_concurrency(items)
        assert 1 <= peak <= 4, f"{host} ran {peak} tasks at once"

    # The agents' log folders are their own, so Airflow can only show what they pushed. A task
    # instance is `success` once its supervisor says so; its agent pushes the last log lines
    # when the process has ended and then reports the job, which is what is waited for here.
    def jobs_reported() -> float:
        return sum(agent.gauge("astro_agent_tasks_finished_total", result="success") or 0 for agent in (a, b))

    wait_for(lambda: jobs_reported() == 40, 120, "both agents to report all 40 jobs")
    for ti in tis:
        text = airflow.client.task_log_text("e2e_short_40", run, ti["task_id"])
        assert f"{MARKER} dag=e2e_short_40 task={ti['task_id']}" in text, text[-2000:]

    launches = sum(agent.gauge("astro_agent_task_launches_total", mode=mode) or 0 for agent in (a, b))
    assert launches == 40, f"all 40 tasks started in {mode} mode"


@LAUNCH_MODES
def test_sigterm_drains_running_tasks_and_reports_offline(airflow, trigger_dag, astro_agent, mode):
    agent = astro_agent("agent-drain", queues=[LONG], sync_slots=4, launch_mode=mode)
    run = trigger_dag("e2e_long_8")
    client = airflow.client

    def running_here():
        tis = client.task_instances("e2e_long_8", run)
        mine = [t for t in tis if t["state"] == "running" and t["hostname"] == "agent-drain"]
        return mine if len(mine) == 4 else None

    running = wait_for(running_here, 300, "4 tasks running on agent-drain", interval=0.5)
    running_ids = {t["task_id"] for t in running}

    agent.send_signal(signal.SIGTERM)
    wait_for(lambda: agent.status("/readyz") == 503, 10, "readyz to turn 503 during the drain", interval=0.1)
    code = agent.wait(timeout=300)
    assert code == 0, agent.log()

    tis = {t["task_id"]: t for t in client.task_instances("e2e_long_8", run)}
    for task_id in running_ids:
        assert tis[task_id]["state"] == "success", (task_id, tis[task_id]["state"])
    assert not [t for t in tis.values() if t["state"] in ("failed", "up_for_retry")]
    # The drained agent took nothing new: the other four never ran on it.
    others = [t for t in tis.values() if t["task_id"] not in running_ids]
    assert all(t["hostname"] in (None, "") for t in others), others
    assert client.edge_worker("agent-drain")["state"] == "offline"


def test_queue_stats_equal_airflows_counts(airflow, trigger_dag, astro_agent):
    agent = astro_agent("agent-stats", queues=[LONG], sync_slots=2)
    run = trigger_dag("e2e_long_8")
    client = airflow.client

    def in_step():
        mine = client.task_instances("e2e_long_8", run)
        if sum(t["state"] == "running" for t in mine) != 2 or sum(t["state"] == "queued" for t in mine) != 6:
            return None
        want = {"queued": client.count(LONG, ["queued"]), "running": client.count(LONG, ["running"])}
        have = {s: agent.gauge("astro_agent_client_queue_stats", queue=LONG, state=s) for s in want}
        return (want, have) if have == {s: float(n) for s, n in want.items()} else None

    want, have = wait_for(in_step, 60, "queue stats equal to Airflow's counts", interval=0.5)
    assert want["queued"] >= 6 and want["running"] >= 2
    assert agent.gauge("astro_agent_slots_in_use") == 2.0


def test_a_launcher_killed_mid_run_loses_no_task(airflow, trigger_dag, astro_agent):
    agent = astro_agent("agent-relaunch", sync_slots=4)
    launcher = wait_for(agent.launcher_pids, 30, "the task launcher", interval=0.2)[0]
    run = trigger_dag("e2e_short_40")
    client = airflow.client
    wait_for(
        lambda: client.count(states=["running"], dag_id="e2e_short_40", run_id=run) > 0,
        120,
        "first tasks running",
        interval=0.2,
    )
    os.kill(launcher, signal.SIGKILL)
    assert client.wait_run("e2e_short_40", run, timeout=900) == "success"
    states = {ti["state"] for ti in client.task_instances("e2e_short_40", run)}
    assert states == {"success"}, states
    # The whole log: its task host's lines too, two more per task, push the kill out of the tail.
    log = agent.daemon.log_file.read_text(errors="replace")
    assert "task launcher exited" in log, agent.log()
    assert wait_for(lambda: [p for p in agent.launcher_pids() if p != launcher], 60, "a new launcher", interval=0.5)


def test_a_launcher_that_cannot_start_falls_back_to_fresh_interpreters(airflow, trigger_dag, astro_agent, tmp_path):
    # A "python" that refuses to run the launcher script as the launcher, and runs everything
    # else (a fresh interpreter runs the script too, for one task: `--one`). The script comes
    # as `-c SOURCE astro-launcher ARG`.
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'case "$1 $3 $4" in "-c astro-launcher --one") ;; "-c astro-launcher "*) echo "launcher refused by the test" >&2; exit 1;; esac\n'
        f'exec {airflow.python} "$@"\n'
    )
    python.chmod(0o755)
    agent = astro_agent("agent-fallback", queues=[MAPPED], sync_slots=4, python=python)
    run = trigger_dag("e2e_mapped_4")
    assert airflow.client.wait_run("e2e_mapped_4", run, timeout=600) == "success"
    assert "task launcher did not start; tasks start in fresh interpreters" in agent.log()
    tis = airflow.client.task_instances("e2e_mapped_4", run)
    assert agent.gauge("astro_agent_task_launches_total", mode="fresh") == len(tis)


def test_airflow_admin_actions_reach_the_agent(airflow, trigger_dag, astro_agent):
    """Concurrency, maintenance and shutdown set in Airflow's UI API take effect."""
    name = "agent-admin"
    agent = astro_agent(name, queues=[MAPPED], sync_slots=4)
    client = airflow.client

    assert agent.gauge("astro_agent_settings_overridden", setting="concurrency") == 0.0
    client.set_worker_concurrency(name, 2)
    wait_for(lambda: agent.gauge("astro_agent_slots") == 2.0, 30, "slots to follow Airflow's concurrency", interval=0.2)
    # The autoscaler still divides by the configured 4: the agent says so.
    assert agent.gauge("astro_agent_settings_overridden", setting="concurrency") == 1.0
    assert "Airflow set this worker's concurrency to 2; the autoscaler still assumes 4 slots" in agent.log()
    assert agent.gauge("astro_agent_settings_overridden", setting="queues") == 0.0

    client.request_maintenance(name)
    wait_for(lambda: client.edge_worker(name)["state"] == "maintenance mode", 30, "maintenance mode", interval=0.5)
    run = trigger_dag("e2e_mapped_4")
    wait_for(lambda: client.count(states=["queued"], dag_id="e2e_mapped_4", run_id=run) == 4, 60, "tasks queued")
    fetches_before = agent.gauge("astro_agent_edge_api_request_duration_seconds_count", call="fetch") or 0
    # Two heartbeats later the agent has still fetched nothing.
    beats = agent.gauge("astro_agent_edge_api_request_duration_seconds_count", call="heartbeat")
    wait_for(
        lambda: agent.gauge("astro_agent_edge_api_request_duration_seconds_count", call="heartbeat") >= beats + 2,
        30,
        "two more heartbeats",
        interval=0.5,
    )
    assert (agent.gauge("astro_agent_edge_api_request_duration_seconds_count", call="fetch") or 0) == fetches_before
    assert client.count(states=["running", "success"], dag_id="e2e_mapped_4", run_id=run) == 0

    client.exit_maintenance(name)
    assert client.wait_run("e2e_mapped_4", run, timeout=600) == "success"

    client.request_shutdown(name)

    # Airflow's heartbeat handler reads the worker's row and then writes the state it derives from
    # it: a heartbeat in flight while the request is stored overwrites it with idle or running
    # (lost in the UI too; a user would ask again). Ask again only then: an agent that ignored a
    # stored request would leave "shutdown request" in place, and fail this wait.
    def exited() -> bool:
        if not agent.daemon.alive():
            return True
        if client.edge_worker(name)["state"] in ("idle", "running"):
            client.request_shutdown(name)
        return False

    wait_for(exited, 60, "the agent to exit on Airflow's shutdown request", interval=1, on_timeout=agent.log)
    assert agent.wait(timeout=5) == 0
    assert client.edge_worker(name)["state"] == "offline"
