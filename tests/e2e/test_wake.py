"""Idle agents woken by the Sentinel, against the real Airflow stack and a real Sentinel reading
the metadata database (``postgres`` source, refreshed every half second).

1. An astro-agent on queue ``wake`` subscribes to the Sentinel's queue events with a static agent
   token; it polls Airflow only every two minutes. A newly triggered task reaches
   ``running`` far sooner than that: the Sentinel's ``rose`` event woke it (its wake-up counter
   says so).
2. The Sentinel hangs (SIGSTOP): its stream falls silent, the agent gives it up after three
   missed keep-alives, fetches at once and polls again, as without a Sentinel; the task
   triggered meanwhile runs.

Also: the agent token opens nothing but the stream (refused on ``/v1/workers``).
"""

from __future__ import annotations

import json
import secrets
import signal
from datetime import datetime
from urllib.parse import urlparse

import pytest

from harness.astro_agent_process import AstroAgent
from harness.procs import wait_for

from test_sentinel import Sentinel, sentinel_bin  # noqa: F401 (a fixture)

QUEUE = "wake"
DAG = "e2e_wake_1"
WORKER = "astro-worker-wake"
IDLE_INTERVAL = 120.0  # seconds, subscribed or not: whatever runs well within it was woken
SILENCE_LIMIT = 30.0  # seconds without a byte after which the agent gives a stream up
AGENT_TOKEN = "agent-" + secrets.token_hex(16)


def queued_to_running(client, run_id: str) -> float:
    """Seconds between the task's queued_dttm and its start_date, as Airflow recorded them."""
    (ti,) = client.task_instances(DAG, run_id)
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(ti["start_date"]) - parse(ti["queued_when"])).total_seconds()


def started(client, run_id: str) -> bool:
    tis = client.task_instances(DAG, run_id)
    return bool(tis) and tis[0]["state"] in ("running", "success")


@pytest.fixture
def sentinel(airflow, sentinel_bin, tmp_path):  # noqa: F811 (the fixture imported above)
    role, password = f"sentinel_ro_{secrets.token_hex(4)}", secrets.token_hex(16)
    airflow.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    airflow.sql(f"GRANT SELECT ON task_instance, edge_worker TO {role}")
    pg = urlparse(airflow.postgres_url)
    s = Sentinel(
        sentinel_bin, tmp_path / "sentinel", {"type": "postgres", "postgres": {"sslMode": "disable"}},
        {"ASTRO_SENTINEL_POSTGRES_URL": f"postgres://{role}:{password}@127.0.0.1:{pg.port}{pg.path}"},
        workers=[{"name": WORKER, "queues": [QUEUE], "syncSlots": 4, "minReplicas": 0, "maxReplicas": 4}],
        refresh=0.5,
    )
    agents = tmp_path / "sentinel" / "agent-tokens"
    agents.write_text(f"{AGENT_TOKEN}\n")
    config_file = tmp_path / "sentinel" / "sentinel.yaml"
    config = json.loads(config_file.read_text())
    config["queueEvents"] = {"auth": {"staticTokensFile": str(agents)}}
    config_file.write_text(json.dumps(config, indent=2))
    s.start()
    wait_for(lambda: s.get("/readyz", token=None)[0] == 200, 30, "the sentinel's first refresh",
             on_timeout=s.daemon.tail)
    yield s
    s.daemon.stop()
    airflow.sql(f"DROP OWNED BY {role}")
    airflow.sql(f"DROP ROLE {role}")


def test_an_idle_agent_is_woken_at_once_and_polls_again_without_the_sentinel(airflow, trigger_dag, sentinel, tmp_path):
    client = airflow.client
    client.ensure_runnable(DAG)
    # A static agent token is nobody to the readers' rules: 401 (a reviewed worker token: 403).
    assert sentinel.get("/v1/workers/" + WORKER, token=AGENT_TOKEN)[0] == 401
    token_file = tmp_path / "agent-token"
    token_file.write_text(AGENT_TOKEN + "\n")
    # Both idle intervals are two minutes: whatever the agent fetches sooner, something woke it.
    agent = AstroAgent(airflow, "astro-wake", queues=[QUEUE], extra_args=[
        "--sentinel-url", f"http://127.0.0.1:{sentinel.port}",
        "--sentinel-token-file", str(token_file),
        "--idle-fetch-interval", f"{int(IDLE_INTERVAL)}s",
        "--subscribed-idle-fetch-interval", f"{int(IDLE_INTERVAL)}s",
    ]).start()
    try:
        wait_for(lambda: agent.gauge("astro_agent_sentinel_subscribed") == 1, 30, "the subscription",
                 on_timeout=lambda: agent.daemon.tail(40))
        fetches = lambda: agent.gauge("astro_agent_edge_api_request_duration_seconds_count", call="fetch") or 0  # noqa: E731
        wait_for(lambda: fetches() >= 1, 30, "the agent's first fetch (it found nothing)")

        run = trigger_dag(DAG)
        wait_for(lambda: started(client, run), IDLE_INTERVAL / 4, "the task running, woken by the Sentinel",
                 on_timeout=lambda: agent.daemon.tail(40))
        assert agent.gauge("astro_agent_wakeups_total") >= 1
        print(f"woken: queued -> running {queued_to_running(client, run):.2f} s")
        assert client.wait_run(DAG, run) == "success"
        assert sentinel.metric("astro_sentinel_queue_event_subscribers") == 1

        # The Sentinel hangs (SIGSTOP): its stream falls silent, the agent gives it up after
        # three missed keep-alives, fetches at once and polls again; the task queued meanwhile runs.
        sentinel.daemon.send_signal(signal.SIGSTOP)
        try:
            run = trigger_dag(DAG)
            wait_for(lambda: started(client, run), SILENCE_LIMIT + IDLE_INTERVAL / 4,
                     "the task running after the agent gave the silent Sentinel up",
                     on_timeout=lambda: agent.daemon.tail(40))
            assert agent.gauge("astro_agent_sentinel_subscribed") == 0
            assert client.wait_run(DAG, run) == "success"
        finally:
            sentinel.daemon.send_signal(signal.SIGCONT)
        log = agent.log()
        assert "subscribed to the Sentinel" in log and "no Sentinel subscription" in log, log
    finally:
        agent.stop()
