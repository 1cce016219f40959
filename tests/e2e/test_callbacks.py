"""Executor callbacks (Airflow 3.3 with edge3 5.x) on astro-agent, against the real stack.

DAG ``e2e_callback_1``: a deadline alert 1 s after its run is queued, whose ``SyncCallback``
(``astro_e2e_tasks.callback_marker``) the Edge executor queues as an Edge job on ``[operators]
default_queue`` (``default``), with a synthetic identity (dag id ``ExecuteCallback``, run id
``ExecuteCallback-<callback id>``, try 0, map index -1). The run's own task waits on a queue
nothing serves, so the deadline is always missed.

For each launch mode, with a Sentinel on each backlog source (airflow-api, postgres) watching
``default``:

* queued: nothing serves ``default`` yet; both Sentinels count the callback as the Edge executor
  does, one job of one slot (``queuedTasks`` = Airflow's queued task instances on ``default``
  + the queued callbacks in the provider's job list);
* running: an agent on ``default`` runs it (the callback holds until the test releases it);
  the agent's ``astro_agent_client_queue_stats{queue="default",state="running"}`` and both
  Sentinels' ``runningTasks`` count it;
* its effect: the callback's files in the worker's AIRFLOW_HOME; its state: ``success`` in
  Airflow's ``callback`` table and in the provider's job list; its log: written by the
  callback in the agent's log folder, kept there (edge3 5.1.0 stores no log for callbacks,
  which the agent's log says).

The test is in the ``queue-default`` group: nothing else may serve ``default`` meanwhile.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from harness.procs import wait_for

from test_sentinel import plain_source, Sentinel, sentinel_bin  # noqa: F401 (a fixture)

DAG = "e2e_callback_1"
QUEUE = "default"
WORKER = "astro-worker-callbacks"
WORKERS = [{"name": WORKER, "queues": [QUEUE], "syncSlots": 1, "minReplicas": 0, "maxReplicas": 5}]
SOURCES = ("airflow-api", "postgres")
MARKER = "astro-e2e marker"


def callbacks(client, state: str) -> list[dict]:
    """The provider's job list, callbacks only (its whole synthetic identity), in ``state``."""
    return [j for j in client.edge_jobs(dag_id_pattern="ExecuteCallback", state=state)
            if j["dag_id"] == "ExecuteCallback" and j["run_id"] == f"ExecuteCallback-{j['task_id']}"
            and j["try_number"] == 0 and j["map_index"] == -1]


@pytest.mark.parametrize("mode", ["prefork", "fresh"])
def test_a_deadline_alerts_callback_runs_on_the_agent_and_is_counted(
        mode, airflow, trigger_dag, astro_agent, sentinel_bin, tmp_path):
    client = airflow.client
    cleanup: list = []
    sentinels: dict[str, Sentinel] = {}
    callback_id = None
    agent_name = f"agent-callbacks-{mode}"
    folder = airflow.worker_dir(agent_name) / "home" / "astro-e2e-callbacks"
    # Short: the run id is in the callback's workload twice, which must fit edge_job.command.
    run_id = f"cb-{uuid.uuid4().hex[:8]}"
    try:
        for source in SOURCES:
            config, env = plain_source(airflow, source, "task_instance, edge_job, edge_worker", cleanup)
            sentinels[source] = Sentinel(sentinel_bin, tmp_path / source, config, env, workers=WORKERS).start()
        trigger_dag(DAG, run_id=run_id)

        def the_callback() -> str | None:
            return airflow.sql(
                "SELECT c.id FROM callback c JOIN deadline d ON d.callback_id = c.id "
                f"JOIN dag_run r ON r.id = d.dagrun_id WHERE r.run_id = '{run_id}'").strip() or None

        callback_id = wait_for(the_callback, 120, "the missed deadline's callback")
        queued = wait_for(lambda: [j for j in callbacks(client, "queued") if j["task_id"] == callback_id] or None,
                          120, "the callback queued as an Edge job")
        assert queued[0]["queue"] == QUEUE, queued
        size = int(airflow.sql(f"SELECT length(command) FROM edge_job WHERE task_id = '{callback_id}'"))
        print(f"the callback's workload: {size} characters (edge_job.command holds 2048)")

        # Queued: counted by both sources as Airflow's queued task instances + queued callbacks.
        def counted(state: str, field: str, agent=None):
            want = client.count(QUEUE, [state]) + len(callbacks(client, state))
            have = {source: s.worker(WORKER)[1].get(field) for source, s in sentinels.items()}
            if agent is not None:
                have["agent"] = agent.gauge("astro_agent_client_queue_stats", queue=QUEUE, state=state)
            return (want, have) if want >= 1 and all(v == want for v in have.values()) else None

        want, have = wait_for(lambda: counted("queued", "queuedTasks"), 30, "the queued callback counted",
                              on_timeout=lambda: {s: x.worker(WORKER) for s, x in sentinels.items()})
        print(f"queued on {QUEUE}: Airflow + callbacks {want}, counted {have}")

        # Running: an agent on `default` takes it; the callback holds until released.
        agent = astro_agent(agent_name, queues=[QUEUE], sync_slots=1, launch_mode=mode)
        wait_for(lambda: (folder / f"{run_id}.started").exists(), 120, "the callback to start on the agent",
                 on_timeout=lambda: agent.log()[-3000:])
        want, have = wait_for(lambda: counted("running", "runningTasks", agent), 30, "the running callback counted",
                              on_timeout=lambda: ({s: x.worker(WORKER) for s, x in sentinels.items()},
                                                  agent.gauge("astro_agent_client_queue_stats", queue=QUEUE,
                                                              state="running")))
        print(f"running on {QUEUE}: Airflow + callbacks {want}, counted {have}")
        assert [j["edge_worker"] for j in callbacks(client, "running") if j["task_id"] == callback_id] == [agent_name]

        (folder / f"{run_id}.release").write_text("go")
        wait_for(lambda: airflow.sql(f"SELECT state FROM callback WHERE id = '{callback_id}'").strip() == "success",
                 120, "the callback's state success in Airflow",
                 on_timeout=lambda: airflow.sql(f"SELECT state, output FROM callback WHERE id = '{callback_id}'"))
        assert (folder / f"{run_id}.done").exists()
        assert [j["task_id"] for j in callbacks(client, "success")].count(callback_id) == 1

        assert agent.gauge("astro_agent_task_launches_total", mode=mode) == 1.0
        wait_for(lambda: agent.gauge("astro_agent_tasks_finished_total", result="success") == 1.0, 30,
                 "the agent to count the callback finished")
        log_file, = Path(agent.stack.worker_log_folder(agent_name), "executor_callbacks").rglob(callback_id)
        assert f"{MARKER} callback run={run_id}" in log_file.read_text()
        assert re.search("keeps no log for executor callbacks", agent.log()), agent.log()[-3000:]
    finally:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{run_id}.release").write_text("go")  # a callback still running ends
        if callback_id:  # one still queued must not reach a later test's worker on `default`
            airflow.sql(f"DELETE FROM edge_job WHERE dag_id = 'ExecuteCallback' AND task_id = '{callback_id}' "
                        "AND state = 'queued'")
        for s in sentinels.values():
            s.stop()
        for step in cleanup:
            try:
                step()
            except Exception as e:  # keep cleaning up
                print(f"cleanup step failed: {e}")
