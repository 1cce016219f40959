"""astro-sentinel against the real Airflow stack, for both backlog sources.

For each source (``airflow-api``: the public REST API with username/password;
``postgres``: the metadata database through a read-only role, over TLS with
``sslMode: verify-full``):

1. 30 tasks queued on queue ``sentinel`` with no worker → the Sentinel reports
   ``queued 30``, ``backlog 30`` and ``desiredReplicas = ceil(30 / syncSlots)``
   within two refresh intervals of Airflow's own count reaching 30;
2. an astro-agent starts → the backlog falls to 0 as the tasks finish, and the history
   times its cold start from Airflow alone (backlog seen → registered → first task running);
3. another 30 queued, then the upstream stops (the api-server, or PostgreSQL) → the
   last value (30, never 0) until the staleness limit, then 503;
4. the upstream comes back → 200 again.

Requests are sent exactly as KEDA's metrics-api scaler sends them (GET, ``Authorization:
Bearer``, no ``Accept``) and ``backlog`` is read by its JSON path.

The sentinel binary: ``$ASTRO_SENTINEL_BIN``, else the workspace's release build
(``cargo build --workspace --release``) and ``${CARGO_TARGET_DIR:-target}/release/astro-sentinel``.

The harness has no public way to stop and start PostgreSQL, so :func:`stop_postgres` and
:func:`start_postgres` below do it with the stack's own cluster folder; the scheduler and
dag-processor exit when the database goes away, so :func:`start_postgres` restarts any
Airflow daemon that died and waits for the stack to be healthy again. Stopping them would
break every other test running meanwhile: this module runs on ``own_airflow``, a stack no
other test uses meanwhile (tests/e2e/conftest.py).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from harness.procs import Daemon, free_port, wait_for
from harness.prometheus_server import promtool

from certificates import make_certificates

REPO = Path(__file__).resolve().parents[2]
QUEUE = "sentinel"
DAG = "e2e_queued_30"
TASKS = 30
REFRESH = 1.0  # seconds
STALENESS = 6.0  # seconds
SYNC_SLOTS = 4
WORKER = "astro-worker-sentinel"
SHARED = "astro-worker-sentinel-big"  # a second Deployment on the same queue
TOKEN = "e2e-" + secrets.token_hex(16)


@pytest.fixture
def airflow(own_airflow):
    """This module's tests, ``trigger_dag`` and ``astro_agent`` included, run on a stack
    no other test uses: they stop its api-server and its database."""
    return own_airflow


# ---- the binary ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sentinel_bin() -> Path:
    given = os.environ.get("ASTRO_SENTINEL_BIN")
    if given:
        return Path(given)
    subprocess.run(["cargo", "build", "--release", "-p", "astro-sentinel"], cwd=REPO, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    binary = target / "release" / "astro-sentinel"
    assert binary.exists(), binary
    return binary


def plain_source(airflow, source: str, tables: str, cleanup: list) -> tuple[dict, dict[str, str]]:
    """The Sentinel's `source` section and environment for `source` against the stack: the REST
    API as admin, or PostgreSQL (no TLS) as a new read-only role granted SELECT on `tables`,
    dropped by the steps appended to `cleanup`."""
    if source == "airflow-api":
        return ({"type": "airflow-api", "airflowApi": {"url": airflow.api_base}},
                {"ASTRO_SENTINEL_AIRFLOW_USERNAME": "admin", "ASTRO_SENTINEL_AIRFLOW_PASSWORD": "admin"})
    role, password = f"sentinel_ro_{secrets.token_hex(4)}", secrets.token_hex(16)
    airflow.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    airflow.sql(f"GRANT SELECT ON {tables} TO {role}")
    cleanup.append(lambda: airflow.sql(f"DROP OWNED BY {role}"))
    cleanup.append(lambda: airflow.sql(f"DROP ROLE {role}"))
    pg = urlparse(airflow.postgres_url)
    return ({"type": "postgres", "postgres": {"sslMode": "disable"}},
            {"ASTRO_SENTINEL_POSTGRES_URL": f"postgres://{role}:{password}@127.0.0.1:{pg.port}{pg.path}"})


class Sentinel:
    """One astro-sentinel process with a config file and a static token."""

    def __init__(self, binary: Path, folder: Path, source: dict, env: dict[str, str],
                 workers: list[dict] | None = None, refresh: float = REFRESH, staleness: float = STALENESS,
                 settings: dict | None = None):
        self.folder = folder
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        tokens = folder / "tokens"
        tokens.write_text(f"# KEDA's token\n{TOKEN}\n")
        config = {
            "refreshInterval": f"{int(refresh * 1000)}ms",
            "stalenessLimit": f"{int(staleness)}s",
            "source": source,
            "auth": {"staticTokensFile": str(tokens)},
            "workers": workers or [
                {"name": WORKER, "queues": [QUEUE], "syncSlots": SYNC_SLOTS, "minReplicas": 0, "maxReplicas": 10},
                {"name": SHARED, "queues": [QUEUE], "syncSlots": 16, "minReplicas": 1, "maxReplicas": 5},
            ],
            **(settings or {}),
        }
        # JSON is YAML: no YAML library needed to write the config.
        (folder / "sentinel.yaml").write_text(json.dumps(config, indent=2))
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ASTRO_SENTINEL_")}
        self.daemon = Daemon(
            "astro-sentinel",
            [str(binary), "--config", str(folder / "sentinel.yaml"), "--listen", f"127.0.0.1:{self.port}"],
            {**clean, "RUST_LOG": "info", **env},
            folder / "sentinel.log",
        )

    def start(self) -> "Sentinel":
        self.daemon.start()
        wait_for(lambda: self.daemon.check_alive() or self.get("/healthz")[0] == 200, 30,
                 "the sentinel to listen", on_timeout=self.daemon.tail)
        return self

    def get(self, path: str, token: str | None = TOKEN) -> tuple[int, str]:
        """GET exactly as KEDA does: Host, Go's User-Agent, bearer token, gzip, no Accept."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.putrequest("GET", path, skip_accept_encoding=True)
            conn.putheader("User-Agent", "Go-http-client/1.1")
            if token:
                conn.putheader("Authorization", f"Bearer {token}")
            conn.putheader("Accept-Encoding", "gzip")
            conn.endheaders()
            r = conn.getresponse()
            return r.status, r.read().decode()
        except OSError as e:
            return 0, str(e)
        finally:
            conn.close()

    def worker(self, name: str = WORKER) -> tuple[int, dict]:
        status, body = self.get(f"/v1/workers/{name}")
        try:
            return status, json.loads(body)
        except ValueError:
            return status, {"raw": body}

    def backlog(self, name: str = WORKER) -> float | None:
        """The backlog KEDA would read, or None when the answer is not a 200."""
        status, body = self.worker(name)
        return backlog_of(body) if status == 200 else None

    def metric(self, name: str) -> float:
        _, text = self.get("/metrics", token=None)
        for line in text.splitlines():
            if line.startswith(name) and line[len(name)] in " {":
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not in /metrics:\n{text}")

    def check_metrics(self) -> str:
        """``/metrics``, after ``promtool check metrics`` found nothing to complain about."""
        status, text = self.get("/metrics", token=None)
        assert status == 200
        check = promtool("check", "metrics", stdin=text)
        assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr
        return text

    def stop(self) -> int | None:
        return self.daemon.stop(sig=signal.SIGTERM, timeout=15)


class Poller(threading.Thread):
    """Asks for the worker every 0.1 s and records (time, status, body) until stopped."""

    def __init__(self, sentinel: Sentinel):
        super().__init__(daemon=True)
        self.sentinel = sentinel
        self.answers: list[tuple[float, int, dict]] = []
        self.done = threading.Event()
        self.got_503 = threading.Event()
        self.first_503: float | None = None

    def run(self):
        while not self.done.is_set():
            status, body = self.sentinel.worker()
            now = time.monotonic()
            self.answers.append((now, status, body))
            if status == 503 and self.first_503 is None:
                self.first_503 = now
                self.got_503.set()
            self.done.wait(0.1)

    def wait_for_503(self, timeout: float) -> float:
        if not self.got_503.wait(timeout):
            self.stop()
            raise AssertionError(f"no 503 within {timeout:.0f}s; last answers {self.answers[-3:]}")
        # Keep polling a little: it must stay an error.
        time.sleep(1.0)
        return self.first_503

    def stop(self) -> list[tuple[float, int, dict]]:
        self.done.set()
        self.join(timeout=15)
        return self.answers


def backlog_of(body: dict) -> float:
    """``valueLocation: backlog`` — KEDA needs a JSON number there."""
    value = body["backlog"]
    assert isinstance(value, (int, float)) and not isinstance(value, bool), body
    return value


# ---- PostgreSQL: TLS, a read-only role, stop and start ------------------------------------


def enable_postgres_tls(stack, certs: Path) -> Path:
    """Turns TLS on in the stack's PostgreSQL (reload, no restart); returns the CA file."""
    ca, crt, key = make_certificates(certs)
    stack._pg.enable_tls(crt, key)
    return ca


def disable_postgres_tls(stack) -> None:
    stack._pg.disable_tls()


def stop_postgres(stack) -> None:
    """Stops the stack's PostgreSQL (fast shutdown: open connections are cut)."""
    pg = stack._pg
    pg._pg("pg_ctl", "-D", str(pg.data_dir), "-m", "fast", "-w", "-t", "30", "stop")


def start_postgres(stack, timeout: float = 180.0) -> None:
    """Starts PostgreSQL again on the same port, then restarts any Airflow daemon that exited
    while it was down and waits for the whole stack to be healthy."""
    pg = stack._pg
    opts = f"-p {pg.port} -k {pg.folder} -c listen_addresses=127.0.0.1 -c max_connections=300"
    pg._pg("pg_ctl", "-D", str(pg.data_dir), "-l", str(pg.log_file), "-o", opts, "-w", "-t", "60", "start")
    for name in ("api-server", "scheduler", "dag-processor"):
        if not stack.daemon(name).alive():
            print(f"{name} exited while the database was down; restarting it")
            stack._start_daemon(name)
    stack._wait_healthy(timeout, need_scheduler=True)


def newest_sample(s: "Sentinel") -> dict:
    status, body = s.get(f"/v1/workers/{WORKER}/history?range=15m")
    assert status == 200, body
    return json.loads(body)["series"][-1]


# ---- the test -----------------------------------------------------------------------------


@pytest.fixture
def sentinels():
    started: list[Sentinel] = []
    yield started
    for s in started:
        s.stop()


@pytest.mark.parametrize("source", ["airflow-api", "postgres"])
def test_sentinel_serves_the_real_backlog(source, airflow, trigger_dag, astro_agent,
                                          sentinel_bin, sentinels, tmp_path):
    client = airflow.client
    cleanup = []
    if source == "airflow-api":
        source_config = {"type": "airflow-api", "airflowApi": {"url": airflow.api_base}}
        env = {"ASTRO_SENTINEL_AIRFLOW_USERNAME": "admin", "ASTRO_SENTINEL_AIRFLOW_PASSWORD": "admin"}
        # One page of the one distinct queue's task instances (30 < 100), the list of executor
        # callbacks (one for all queues), and the list of Edge workers (the history's Running
        # line outside Kubernetes).
        upstream_per_refresh = 3
    else:
        role, password = f"sentinel_ro_{secrets.token_hex(4)}", secrets.token_hex(16)
        airflow.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        airflow.sql(f"GRANT SELECT ON task_instance, edge_worker TO {role}")
        cleanup.append(lambda: airflow.sql(f"DROP OWNED BY {role}"))
        cleanup.append(lambda: airflow.sql(f"DROP ROLE {role}"))
        ca = enable_postgres_tls(airflow, tmp_path / "certs")
        cleanup.insert(0, lambda: disable_postgres_tls(airflow))
        pg = urlparse(airflow.postgres_url)
        source_config = {"type": "postgres", "postgres": {"sslMode": "verify-full", "caFile": str(ca)}}
        env = {"ASTRO_SENTINEL_POSTGRES_URL": f"postgres://{role}:{password}@127.0.0.1:{pg.port}{pg.path}"}
        # One GROUP BY for all queues (task instances only: this role may not read edge_job,
        # so the Sentinel counts no callbacks and says so), and the Edge workers.
        upstream_per_refresh = 2
    try:
        run_scenario(source, airflow, client, trigger_dag, astro_agent, sentinel_bin, sentinels,
                     tmp_path, source_config, env, upstream_per_refresh)
    finally:
        for s in sentinels:
            s.stop()
        for step in cleanup:
            try:
                step()
            except Exception as e:  # keep cleaning up
                print(f"cleanup step failed: {e}")


def run_scenario(source, airflow, client, trigger_dag, astro_agent, sentinel_bin, sentinels,
                 tmp_path, source_config, env, upstream_per_refresh):
    s = Sentinel(sentinel_bin, tmp_path / "sentinel", source_config, env)
    sentinels.append(s)
    s.start()

    # The queue starts empty (earlier tests' runs were abandoned), and that 0 is a real one.
    wait_for(lambda: s.backlog() == 0, 30, "backlog 0 on an empty queue",
             on_timeout=lambda: f"{s.worker()}\n{s.daemon.tail()}")
    assert s.get(f"/v1/workers/{WORKER}", token=None)[0] == 401
    assert s.get(f"/v1/workers/{WORKER}", token="not-the-token")[0] == 401
    assert s.get("/v1/workers/no-such-worker")[0] == 404
    if source == "postgres":
        tls = airflow.sql(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
            f"WHERE a.usename = '{urlparse(env['ASTRO_SENTINEL_POSTGRES_URL']).username}' AND s.ssl"
        )
        assert int(tls.strip()) >= 1, "the sentinel's connection is not encrypted"

    # 1. Thirty tasks queued, nothing serves the queue.
    trigger_dag(DAG)
    seen_by_airflow = seen_by_sentinel = None
    answer: dict = {}
    deadline = time.monotonic() + 120
    while seen_by_airflow is None or seen_by_sentinel is None:
        assert time.monotonic() < deadline, f"no 30 queued: airflow {seen_by_airflow}, sentinel {answer}"
        status, body = s.worker()
        if seen_by_sentinel is None and status == 200 and body["queued"] == TASKS:
            seen_by_sentinel, answer = time.monotonic(), body
        if seen_by_airflow is None and client.count(QUEUE, ["queued"]) == TASKS:
            seen_by_airflow = time.monotonic()
        time.sleep(0.05)
    lag = seen_by_sentinel - seen_by_airflow
    print(f"{source}: the sentinel showed 30 queued {lag:+.2f}s after Airflow's REST API did")
    assert lag <= 2 * REFRESH + 0.3, f"took {lag:.2f}s, more than two refresh intervals"
    assert answer["worker"] == WORKER
    assert answer["queues"] == [QUEUE]
    assert (answer["queued"], answer["running"]) == (TASKS, 0)
    assert (answer["queuedTasks"], answer["runningTasks"]) == (TASKS, 0)
    assert backlog_of(answer) == TASKS
    assert answer["syncSlots"] == SYNC_SLOTS
    assert answer["desiredReplicas"] == math.ceil(TASKS / SYNC_SLOTS) == 8
    assert (answer["minReplicas"], answer["maxReplicas"]) == (0, 10)
    assert answer["updatedAt"].endswith("Z") and answer["ageSeconds"] <= STALENESS
    status, big = s.worker(SHARED)
    assert status == 200 and backlog_of(big) == TASKS and big["desiredReplicas"] == 2  # ceil(30/16)
    metrics = s.check_metrics()
    assert f'astro_sentinel_worker_backlog{{worker="{WORKER}"}} 30' in metrics
    assert f'astro_sentinel_worker_desired_replicas{{worker="{WORKER}"}} 8' in metrics

    # 2. A worker starts: the backlog drains to 0.
    # The agent names its tasks' host after itself, as the chart's Pods do: the Sentinel finds
    # the worker's first task by it.
    worker = astro_agent(f"astro-sentinel-{source}", queues=[QUEUE], sync_slots=8)
    observed = []

    def drained():
        status, body = s.worker()
        if status == 200:
            observed.append(backlog_of(body))
            return backlog_of(body) == 0 and body["desiredReplicas"] == 0
        return False

    wait_for(drained, 180, "the backlog to fall to 0", interval=0.2,
             on_timeout=lambda: f"observed {observed[-20:]}; {client.counts_by_state(QUEUE)}; "
                                f"the agent's log (end):\n{worker.log()}")
    print(f"{source}: backlog while the worker ran: {sorted(set(observed), reverse=True)}")
    assert client.count(QUEUE, ["queued", "running"]) == 0
    # Outside Kubernetes the history's Running line is Airflow's count of online Edge workers
    # on the queue: the one worker, then none once it has stopped.
    wait_for(lambda: newest_sample(s)["running"] == 1, 30, "the history to record 1 running worker",
             on_timeout=lambda: f"{newest_sample(s)}")
    assert worker.stop() == 0
    wait_for(lambda: newest_sample(s)["running"] == 0, 30, "the history to record 0 running workers",
             on_timeout=lambda: f"{newest_sample(s)}")
    history = json.loads(s.get(f"/v1/workers/{WORKER}/history?range=15m")[1])
    assert set(history["missing"]) == {"workers", "waiting"}, history["missing"]
    # Outside Kubernetes a cold start is timed from Airflow alone: backlog seen (the refresh),
    # the worker's registration and its first task; the Kubernetes phases are absent, not 0.
    cold = history["coldStarts"]
    assert cold["phases"] == ["backlogSeen", "agentRegistered", "firstTaskRunning"]
    (start,) = [c for c in cold["starts"] if c["worker"] == worker.name]
    print(f"{source}: cold start of {worker.name}: {start['durations']}, total {start['totalMs']} ms")
    assert (start["kind"], start["outcome"]) == ("fromZero", "complete"), start
    assert [p["phase"] for p in start["phases"]] == cold["phases"]
    assert [p["seen"] for p in start["phases"]] == ["sentinel", "airflow", "airflow"]
    assert start["totalMs"] == sum(d["ms"] for d in start["durations"]) > 0
    assert f'astro_sentinel_cold_start_seconds_count{{start="from_zero",worker="{WORKER}"}} 1' in s.check_metrics()
    assert s.worker(SHARED)[1]["desiredReplicas"] == 1, "held at minReplicas"

    # Upstream cost: a fixed number of reads per refresh, however often we asked.
    refreshes = s.metric("astro_sentinel_refreshes_total")
    upstream = s.metric("astro_sentinel_upstream_requests_total")
    # The list of Edge workers runs on its own loop: one behind the refreshes on a quiet machine,
    # and a few more on a loaded one (seen: 6 behind over 114 refreshes at load 12), where its
    # timer fires late. The bound that matters is the upper one: asking more often costs
    # Airflow nothing extra.
    # The agent's cold start (one per worker Deployment on the queue) asks for its first task,
    # one request or query for both, on each refresh from the agent's registration until its
    # first task runs: while the agent's launcher imports Airflow (5 s here, 13 s on a loaded
    # machine), plus a refresh on either side.
    lag = 1 + refreshes // 10
    (waiting_for_first_task,) = [d["ms"] for d in start["durations"] if d["to"] == "firstTaskRunning"]
    first_task_looks = math.ceil(waiting_for_first_task / 1000 / REFRESH) + 2
    # And every 30 s one count of the queue's task instances held in scheduled.
    held = s.metric("astro_sentinel_held_task_reads_total")
    assert held >= 1
    assert refreshes * upstream_per_refresh - lag <= upstream \
        <= (refreshes + 1) * upstream_per_refresh + 4 + first_task_looks + held, (refreshes, upstream, held)

    # 3. Thirty more queued, then the upstream goes away: the last value, then 503 — never 0.
    trigger_dag(DAG)
    wait_for(lambda: s.backlog() == TASKS, 120, "backlog 30 again")
    # Poll from another thread while the upstream stops: stopping the api-server takes seconds.
    poller = Poller(s)
    poller.start()
    stopped_at = time.monotonic()
    if source == "airflow-api":
        airflow.stop_api_server()
    else:
        stop_postgres(airflow)
    try:
        first_503 = poller.wait_for_503(STALENESS + 3 * REFRESH + 20)
        answers = poller.stop()
        went_stale = first_503 - stopped_at
        oks = [body for t, status, body in answers if status == 200 and t >= stopped_at]
        print(f"{source}: 503 {went_stale:.1f}s after the upstream began to stop "
              f"({len(oks)} x 200 with the last value before)")
        for t, status, body in answers:
            assert status in (200, 503), (status, body)
            if status == 200:
                assert t < first_503, f"a 200 after the first 503: {body}"
                assert backlog_of(body) == TASKS, f"a 200 with a made-up value: {body}"
        assert len(oks) >= 1, "the last value was not served at all before going stale"
        # The last good read happened at most one interval (plus its own duration) before the stop.
        assert went_stale >= STALENESS - REFRESH - 0.5, f"stale after only {went_stale:.1f}s"
        status, body = s.worker()
        assert status == 503, (status, body)
        assert body["reason"] == "stale", body
        assert "backlog" not in body and "desiredReplicas" not in body, body
        assert body["queueStatus"][0]["lastError"]
        assert s.get("/readyz", token=None)[0] == 200, "stays in the Service: KEDA hears the 503"
        assert s.get("/healthz", token=None)[0] == 200
        assert s.metric('astro_sentinel_queue_refresh_failures_total{queue="sentinel"}') >= 1
        metrics = s.check_metrics()
        assert f'astro_sentinel_worker_available{{worker="{WORKER}"}} 0' in metrics
        assert "astro_sentinel_worker_backlog{" not in metrics, "no backlog series while stale"
    finally:
        # 4. The upstream comes back.
        if source == "airflow-api":
            airflow.start_api_server()
        else:
            start_postgres(airflow)
    back = time.monotonic()
    wait_for(lambda: s.worker()[0] == 200, 60, "200 after the upstream came back",
             on_timeout=lambda: f"{s.worker()}\n{s.daemon.tail()}")
    print(f"{source}: 200 again {time.monotonic() - back:.1f}s after the upstream was back")
    assert backlog_of(s.worker()[1]) == TASKS

    assert s.stop() == 0, "SIGTERM is a clean stop"
    log = (s.folder / "sentinel.log").read_text()
    assert TOKEN not in log, "the bearer token reached the log"
    if source == "postgres":
        assert urlparse(env["ASTRO_SENTINEL_POSTGRES_URL"]).password not in log, "the password reached the log"
