"""Pre-warm from Airflow's schedule, against the real Airflow stack.

DAG ``e2e_prewarm_1`` runs every minute on the minute, one task on queue ``prewarm`` that
nothing serves (it stays queued). Unpausing it creates a run for the minute just past at once
(no catchup, but the latest tick runs); the test fails that one so that the queue is empty. The
Sentinel reads the schedule every 5 s through the REST API, with a pre-warm lead of 50 s:

1. Before the next run's ``run_after``: the worker's answer carries ``expectedSlots`` 1 (its one
   task's slot) for that run (``expectedFor``), apart from the real ``backlog`` 0, and
   ``desiredReplicas`` 1; ``/metrics`` says the same.
2. Once the scheduler has queued the run's task: ``backlog`` 1 and ``expectedSlots`` 0 — the real
   backlog took over — never before ``run_after``.
3. The history's pre-warm log says what happened, in words.

Costs about one minute (the wait for the next minute's run).
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

from harness.procs import wait_for

from test_sentinel import Sentinel, sentinel_bin, sentinels  # noqa: F401 (fixtures)

DAG = "e2e_prewarm_1"
QUEUE = "prewarm"
WORKER = "astro-worker-prewarm"
LEAD_S = 50
WORKERS = [{"name": WORKER, "queues": [QUEUE], "syncSlots": 4, "minReplicas": 0, "maxReplicas": 10,
            "preWarm": {"lead": f"{LEAD_S}s"}}]


def start_sentinel(airflow, binary, folder) -> Sentinel:
    s = Sentinel(binary, folder, {"type": "airflow-api", "airflowApi": {"url": airflow.api_base}},
                 {"ASTRO_SENTINEL_AIRFLOW_USERNAME": "admin", "ASTRO_SENTINEL_AIRFLOW_PASSWORD": "admin"},
                 workers=WORKERS)
    config_file = folder / "sentinel.yaml"
    config = json.loads(config_file.read_text())
    config["schedule"] = {"readInterval": "5s"}
    config_file.write_text(json.dumps(config, indent=2))
    return s.start()


def epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def test_expected_slots_lead_a_scheduled_run_and_give_way_to_its_tasks(airflow, sentinel_bin, sentinels,
                                                                      tmp_path):
    client = airflow.client
    s = start_sentinel(airflow, sentinel_bin, tmp_path / "sentinel")
    sentinels.append(s)
    client.ensure_runnable(DAG)
    try:
        # The run for the minute just past, created on the unpause (on a busy machine the next
        # minute's too): out of the way.
        created = wait_for(lambda: client.get(f"/api/v2/dags/{DAG}/dagRuns")["dag_runs"], 30,
                           "the run created on the unpause")
        for run in created:
            airflow.abandon_run(DAG, run["dag_run_id"])

        def abandon_runs_due_by(moment: float) -> None:
            for run in client.get(f"/api/v2/dags/{DAG}/dagRuns")["dag_runs"]:
                if run["state"] in ("queued", "running") and epoch(run["run_after"]) <= moment:
                    airflow.abandon_run(DAG, run["dag_run_id"])

        def warm():
            status, body = s.worker(WORKER)
            seen = time.time()
            if status == 200 and body["backlog"] > 0:
                # A run that came before this poll caught its window (a slow start on a busy
                # machine): nothing serves the queue, so its task would stay queued and hold
                # the backlog above 0 for every later window. Out of the way with it.
                abandon_runs_due_by(seen)
                return None
            if (status == 200 and body["expectedSlots"] > 0 and body["backlog"] == 0
                    and seen < epoch(body["expectedFor"][0]["runAfter"])):
                return body, seen
            return None

        # The next minute's run, or the one after when the first read comes too late for it.
        body, seen = wait_for(warm, 150, "expectedSlots before a run's run_after", interval=0.5,
                              on_timeout=s.daemon.tail)
        run_after = epoch(body["expectedFor"][0]["runAfter"])
        assert body["expectedFor"] == [{"dag": DAG, "runAfter": body["expectedFor"][0]["runAfter"]}]
        assert run_after - seen <= LEAD_S + 1, (run_after, seen)
        assert (body["backlog"], body["queued"], body["expectedSlots"], body["desiredReplicas"]) == (0, 0, 1, 1), body
        assert s.metric(f'astro_sentinel_worker_expected_slots{{worker="{WORKER}"}}') == 1
        assert s.metric(f'astro_sentinel_worker_backlog{{worker="{WORKER}"}}') == 0

        def taken_over():
            status, body = s.worker(WORKER)
            if status != 200:
                return None
            if body["expectedSlots"] == 0:
                return body, time.time()
            return None

        body, dropped = wait_for(taken_over, run_after - time.time() + 60, "the real backlog to take over",
                                 interval=0.2, on_timeout=s.daemon.tail)
        assert dropped >= run_after, "pre-warm ended before the run was due"
        assert (body["backlog"], body["expectedFor"]) == (1, []), body
        # The task queued is the scheduled run's.
        queued = client.get(f"/api/v2/dags/{DAG}/dagRuns/~/taskInstances", state="queued")["task_instances"]
        assert [epoch(ti["run_after"]) for ti in queued] == [run_after], queued

        _, text = s.get(f"/v1/workers/{WORKER}/history?range=15m")
        log = json.loads(text)["preWarm"]
        entries = [e for e in log["entries"] if epoch(e["runAfter"]) == run_after]
        assert [e["outcome"] for e in entries] == ["opened", "workArrived"], log
        hhmmss = time.strftime("%H:%M:%S", time.gmtime(run_after))
        opened = entries[0]["text"]
        assert opened.startswith("pre-warmed 1 worker at "), opened
        # Learned from the abandoned runs if the schedule was read after they failed.
        assert (f" for {DAG} (runs at {hhmmss}; never run yet: its tasks on these queues take 1 slot, "
                "counted up to one worker's 4 slots)" in opened
                or re.search(rf" for {DAG} \(runs at {hhmmss}; last \d runs? needed 1 slot at start\)", opened)), opened
    finally:
        client.request("PATCH", f"/api/v2/dags/{DAG}", json={"is_paused": True})
        for run in client.get(f"/api/v2/dags/{DAG}/dagRuns")["dag_runs"]:
            airflow.abandon_run(DAG, run["dag_run_id"])
