"""Every kind of task instance a worker meets, in one run on one agent: a success, a failure,
a retry, a mapped task and a task holding two pool slots, each with its log shipped to Airflow.

The compatibility matrix (tests/compat/run.sh) runs this file, with the drain test, against the
newest patch of every Airflow 3 minor; in the e2e stage it runs against the default pair."""

from __future__ import annotations

import json
import re

import pytest

from harness.procs import wait_for

DAG = "e2e_compat_mix"
MARKER = "astro-e2e marker"

#: An Execution API token (a JWT): three base64url segments, the last two long.
TOKEN = re.compile(r"[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}")

#: task id -> (final state, the try that ended it, map indexes)
EXPECTED = {
    "ok": ("success", 1, [-1]),
    "fails": ("failed", 1, [-1]),
    "retried": ("success", 2, [-1]),
    "mapped": ("success", 1, [0, 1, 2]),
    "two_slots": ("success", 1, [-1]),
}


@pytest.mark.parametrize("mode", ["prefork", "fresh"])
def test_every_kind_of_task_instance_runs_reports_and_ships_its_log(airflow, trigger_dag, astro_agent, mode):
    agent = astro_agent(f"agent-compat-{mode}", queues=["compat"], sync_slots=4, launch_mode=mode)
    run = trigger_dag(DAG)
    state = airflow.client.wait_run(DAG, run, timeout=300)
    assert state == "failed", "the run fails because its task `fails` does"

    tis = airflow.client.task_instances(DAG, run)
    seen = {}
    for ti in tis:
        seen.setdefault(ti["task_id"], []).append(ti)
    assert sorted(seen) == sorted(EXPECTED)
    for task_id, (final, tries, map_indexes) in EXPECTED.items():
        items = sorted(seen[task_id], key=lambda t: t["map_index"])
        assert [t["map_index"] for t in items] == map_indexes, task_id
        for ti in items:
            assert (ti["state"], ti["try_number"], ti["hostname"]) == (final, tries, agent.name), (task_id, ti)
    assert seen["two_slots"][0]["pool_slots"] == 2

    # Every try's log reached Airflow: the agent pushes a task's last lines before reporting it.
    def reported() -> float:
        return sum(agent.gauge("astro_agent_tasks_finished_total", result=r) or 0 for r in ("success", "failed"))

    tries = sum(tries * len(map_indexes) for _, tries, map_indexes in EXPECTED.values())
    wait_for(lambda: reported() >= tries, 120, f"the agent to report all {tries} tries")
    for task_id, (_, last_try, map_indexes) in EXPECTED.items():
        for map_index in map_indexes:
            for try_number in range(1, last_try + 1):
                text = airflow.client.task_log_text(DAG, run, task_id, try_number=try_number, map_index=map_index)
                assert f"{MARKER} dag={DAG} task={task_id} run={run} try={try_number} map={map_index}" in text, (
                    task_id, try_number, map_index, text[-1500:])
    # The failure's exception is in the log's structured entries (not in their text lines).
    failed_log = json.dumps(airflow.client.task_log(DAG, run, "fails", 1, -1))
    assert "astro-e2e intended failure" in failed_log, failed_log[-1500:]

    # No Execution API token in what the agent logged, nor in what it appended to the failed
    # task's log from its supervisor's output (Airflow 3.0's supervisor can print its workload
    # there, token included; the task host redacts it before reporting).
    agent_log = agent.daemon.log_file.read_text(errors="replace")
    for where, text in (("the agent's log", agent_log), ("the failed task's log", failed_log)):
        found = TOKEN.search(text)
        assert not found, f"a token in {where}: {found.group(0)[:24]}..."
