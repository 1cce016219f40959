"""astro-sentinel benchmark (run through run.sh, which installs wrk and builds the binary).

Measures, with 200 configured workers over 50 queues and static-token auth on:
* cached ``GET /v1/workers/{name}`` throughput and latency percentiles (wrk on loopback, a Lua
  script rotating worker names and sending the bearer token);
* where the latency tail comes from: the same server's ``/healthz`` (hyper, the connection
  limits and the request counter, without auth, cache or JSON) under the same load, and the
  cached path again with the Sentinel on one core (one tokio worker thread) and wrk on another,
  so that the two do not take turns on the same cores;
* the Sentinel's RSS (current and peak);
* upstream cost per refresh for each source, under load and idle: REST requests
  (airflow-api) or SQL queries (postgres), from the Sentinel's own metrics and, as a cross-check,
  from the upstream itself (the fake API's request count; PostgreSQL's scan count of
  task_instance).

Upstreams are stand-ins so that this runs without Airflow: a tiny Python HTTP server that
lists task instances (fake_airflow.py) and a private PostgreSQL cluster holding a minimal
``task_instance`` table. Every process is started here, recorded by PID and stopped on exit.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from harness.postgres import PostgresCluster
import fake_airflow
from harness.procs import Daemon, free_port, rss_mb, wait_for
from harness.prometheus_server import promtool  # Debian's promtool, fetched when missing

HERE = Path(__file__).resolve().parent

WORKERS = 200
QUEUES = 50
REFRESH_S = 2
DURATION = int(os.environ.get("BENCH_DURATION", "10"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "16"))
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
TARGETS = {"rps": 50_000, "p99_ms": 1.0, "rss_mb": 30.0}

WRK_LUA = r"""
local n = 0
local workers = tonumber(os.getenv("BENCH_WORKERS"))
local fixed = os.getenv("BENCH_PATH")
local headers = { ["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN") }
request = function()
  local path = fixed ~= "" and fixed or string.format("/v1/workers/astro-worker-%03d", n % workers)
  n = n + 1
  return wrk.format("GET", path, headers)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d bad_status=%d socket_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, e.status, e.connect + e.read + e.write + e.timeout))
end
"""


def http_get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def metric(text: str, name: str) -> float:
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
            found = True
    if not found:
        raise AssertionError(f"{name} not in metrics")
    return total


class Sentinel:
    def __init__(self, work: Path, name: str, source: dict, env: dict[str, str], token: str,
                 cpus: str | None = None):
        """``cpus``: a taskset CPU list the Sentinel (all its threads) is bound to."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        folder = work / name
        folder.mkdir()
        (folder / "tokens").write_text(token + "\n")
        workers = [
            {"name": f"astro-worker-{i:03d}", "queues": [f"queue-{i % QUEUES:02d}"],
             "syncSlots": 16, "minReplicas": 0, "maxReplicas": 20}
            for i in range(WORKERS)
        ]
        config = {"refreshInterval": f"{REFRESH_S}s", "stalenessLimit": "30s", "source": source,
                  "auth": {"staticTokensFile": str(folder / "tokens")}, "workers": workers}
        (folder / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ASTRO_SENTINEL_")}
        pin = ["taskset", "-c", cpus] if cpus else []
        self.daemon = Daemon(name, [*pin, os.environ["ASTRO_SENTINEL_BIN"], "--config", str(folder / "config.yaml"),
                                    "--listen", f"127.0.0.1:{self.port}"],
                             {**clean, "RUST_LOG": "warn", **env}, folder / "sentinel.log")

    def start(self) -> "Sentinel":
        self.daemon.start()
        wait_for(lambda: self.daemon.check_alive() or http_get(f"{self.base}/readyz")[0] == 200, 30,
                 f"{self.daemon.name} ready", on_timeout=self.daemon.tail)
        return self

    def metrics(self) -> str:
        return http_get(f"{self.base}/metrics")[1]

    def cpu_seconds(self) -> float:
        """User + system CPU time the Sentinel has used so far."""
        fields = Path(f"/proc/{self.daemon.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> tuple[float, float]:
        return rss_mb(self.daemon.pid)


def run_wrk(base: str, token: str, lua: Path, duration: int, cpus: str | None = None,
            path: str | None = None) -> dict[str, float]:
    """One wrk run: the Lua script's rotating worker paths, or ``path`` for every request;
    bound to ``cpus`` (a taskset list) when given."""
    env = dict(os.environ, BENCH_TOKEN=token, BENCH_WORKERS=str(WORKERS), BENCH_PATH=path or "")
    pin = ["taskset", "-c", cpus] if cpus else []
    out = subprocess.run(
        [*pin, "wrk", f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{duration}s", "-s", str(lua), f"{base}/"],
        env=env, check=True, capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("RESULT "))
    r = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run of median throughput."""
    return sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]


def after_refresh(s: Sentinel) -> str:
    """The Sentinel's /metrics just after it finished a refresh. A window whose two ends are
    taken so holds whole refreshes: a refresh sends its requests before it counts as done, so
    ends taken at any moment may count the requests of a refresh under way but not the refresh."""
    before = metric(s.metrics(), "astro_sentinel_refreshes_total")
    deadline = time.monotonic() + 5 * REFRESH_S
    while time.monotonic() < deadline:
        text = s.metrics()
        if metric(text, "astro_sentinel_refreshes_total") > before:
            return text
        time.sleep(0.01)  # the Sentinel has no event for a finished refresh; its counter is polled
    raise AssertionError(f"no refresh finished in {5 * REFRESH_S} s")


def upstream_window(s: Sentinel, seconds: float, load, upstream_count) -> dict:
    """Refreshes, upstream calls (the Sentinel's count, and the upstream's own by kind), and
    KEDA-style requests served over a window of whole refreshes, with or without load."""
    m0 = after_refresh(s)
    u0 = upstream_count()
    if load:
        load()
    else:
        time.sleep(seconds)  # the measurement is "what happens in this much idle time"
    m1 = after_refresh(s)
    u1 = upstream_count()
    d = lambda name: metric(m1, name) - metric(m0, name)  # noqa: E731
    refreshes = d("astro_sentinel_refreshes_total")
    return {
        "refreshes": refreshes,
        "held_reads": d("astro_sentinel_held_task_reads_total"),
        "per_refresh": d("astro_sentinel_upstream_requests_total") / max(refreshes, 1),
        "seen_per_refresh": {kind: (u1[kind] - u0[kind]) / max(refreshes, 1) for kind in u1},
        "served": d("astro_sentinel_http_requests_total"),
    }


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="astro-sentinel-bench-"))
    os.chmod(work, 0o711)  # the postgres user must reach work/pg
    daemons: list[Daemon] = []
    pg: PostgresCluster | None = None
    token = secrets.token_urlsafe(32)
    lua = work / "rotate.lua"
    lua.write_text(WRK_LUA)
    failures = []
    try:
        load_before = f"{os.getloadavg()[0]:.1f}"
        print("astro-sentinel benchmark")
        print(f"  {WORKERS} workers over {QUEUES} queues, refresh {REFRESH_S}s, static-token auth on, "
              f"wrk -t{THREADS} -c{CONNECTIONS} on loopback, {os.cpu_count()} CPUs")
        print("  upstreams are stand-ins, not a real Airflow: a fake REST API (fake_airflow.py) and a "
              "private PostgreSQL with a minimal task_instance table")

        # ---- airflow-api source against the fake REST API -------------------------------
        fake, fake_url = fake_airflow.start(work)
        daemons.append(fake)
        fake_count = lambda: json.loads(http_get(f"{fake_url}/requests")[1])  # noqa: E731

        s = Sentinel(work, "sentinel-airflow-api", {"type": "airflow-api", "airflowApi": {"url": fake_url}},
                     {"ASTRO_SENTINEL_AIRFLOW_TOKEN": "fake"}, token).start()
        daemons.append(s.daemon)
        status, body = http_get(f"{s.base}/v1/workers/astro-worker-007", token)
        assert status == 200, body
        assert http_get(f"{s.base}/v1/workers/astro-worker-007")[0] == 401

        run_wrk(s.base, token, lua, 3)  # warm-up
        runs: list[dict[str, float]] = []

        def load():
            for _ in range(RUNS):
                cpu0 = s.cpu_seconds()
                r = run_wrk(s.base, token, lua, DURATION)
                r["cpu_us"] = (s.cpu_seconds() - cpu0) / r["requests"] * 1e6
                runs.append(r)

        loaded = upstream_window(s, DURATION, load, fake_count)
        rss, peak = s.rss_mb()
        idle = upstream_window(s, DURATION, None, fake_count)
        floor = median_run([run_wrk(s.base, token, lua, DURATION, path="/healthz") for _ in range(RUNS)])
        print(f"\ncached GET /v1/workers/{{name}} (airflow-api source), {RUNS} runs of {DURATION}s; "
              f"load average before: {load_before}, after: {os.getloadavg()[0]:.1f}")
        for i, r in enumerate(runs, 1):
            print(f"  run {i}: {r['rps']:>9,.0f} requests/s, p50 {r['p50_us'] / 1000:.3f} ms, "
                  f"p99 {r['p99_us'] / 1000:.3f} ms, sentinel CPU {r['cpu_us']:.1f} us/request")
        result = median_run(runs)
        print("  median run:")
        print(f"  throughput   {result['rps']:>10,.0f} requests/s   (target >= {TARGETS['rps']:,})")
        print(f"  latency      p50 {result['p50_us'] / 1000:.3f} ms, p90 {result['p90_us'] / 1000:.3f} ms, "
              f"p99 {result['p99_us'] / 1000:.3f} ms, max {result['max_us'] / 1000:.3f} ms   "
              f"(target p99 <= {TARGETS['p99_ms']} ms)")
        bad = sum(r["bad_status"] for r in runs)
        sock = sum(r["socket_errors"] for r in runs)
        print(f"  errors       {bad:.0f} non-2xx, {sock:.0f} socket errors (all runs)")
        print(f"  sentinel CPU {result['cpu_us']:.1f} us per request (user+system, kernel networking included): "
              f"one free core serves ~{1e6 / result['cpu_us']:,.0f} requests/s")
        print(f"  sentinel RSS {rss:.1f} MB now, {peak:.1f} MB peak   (target <= {TARGETS['rss_mb']:.0f} MB)")
        print("\nwhere the latency tail comes from (median runs, same wrk settings):")
        print(f"  GET /healthz, same server     {floor['rps']:>10,.0f} requests/s, p50 {floor['p50_us'] / 1000:.3f} ms, "
              f"p99 {floor['p99_us'] / 1000:.3f} ms   (no auth, cache or JSON: the stack's floor)")
        if (os.cpu_count() or 1) >= 2:
            s.daemon.stop()
            own = Sentinel(work, "sentinel-own-core", {"type": "airflow-api", "airflowApi": {"url": fake_url}},
                           {"ASTRO_SENTINEL_AIRFLOW_TOKEN": "fake", "TOKIO_WORKER_THREADS": "1"}, token, cpus="0").start()
            daemons.append(own.daemon)
            run_wrk(own.base, token, lua, 3, cpus="1")  # warm-up
            apart = median_run([run_wrk(own.base, token, lua, DURATION, cpus="1") for _ in range(RUNS)])
            own.daemon.stop()
            print(f"  Sentinel on CPU 0 (1 thread), {apart['rps']:>7,.0f} requests/s, p50 {apart['p50_us'] / 1000:.3f} ms, "
                  f"p99 {apart['p99_us'] / 1000:.3f} ms")
            print("  wrk on CPU 1")
        print("\nupstream cost, airflow-api source (REST requests per refresh; expected: one backlog list "
              f"per distinct queue ({QUEUES}), executor callbacks (1) and the Edge worker census (1, on the "
              f"refresh cadence in its own loop); and, every 30 s, one count of held tasks per queue)")
        for label, w in (("under load", loaded), ("idle", idle)):
            seen = w["seen_per_refresh"]
            print(f"  {label:<11} {w['per_refresh']:6.1f} per refresh (fake API saw {seen['backlog_lists']:.1f} "
                  f"backlog lists, {seen['held_counts']:.1f} held counts ({w['held_reads']:.0f} reads of "
                  f"held tasks) and {seen['other']:.1f} other), {w['refreshes']:.0f} refreshes, "
                  f"{w['served']:,.0f} HTTP requests served")
        if result["rps"] < TARGETS["rps"]:
            failures.append(f"throughput {result['rps']:.0f} < {TARGETS['rps']}")
        if result["p99_us"] / 1000 > TARGETS["p99_ms"]:
            failures.append(f"p99 {result['p99_us'] / 1000:.2f} ms > {TARGETS['p99_ms']} ms")
        if peak > TARGETS["rss_mb"]:
            failures.append(f"peak RSS {peak:.1f} MB > {TARGETS['rss_mb']} MB")
        if bad or sock:
            failures.append("wrk saw errors")
        for w in (loaded, idle):
            # The backlog lists are the refresh's own: exactly one per queue; the held counts one
            # per queue per read of held tasks. The census ticks on its own timer, so a window of
            # whole refreshes may hold one tick more or less.
            seen = w["seen_per_refresh"]
            if abs(seen["backlog_lists"] - QUEUES) > 0.5:
                failures.append(f"airflow-api: {seen['backlog_lists']:.1f} backlog lists per refresh, expected {QUEUES}")
            held = seen["held_counts"] * w["refreshes"]
            if abs(held - QUEUES * w["held_reads"]) > 0.5:
                failures.append(f"airflow-api: {held:.0f} held counts for {w['held_reads']:.0f} reads of held tasks, "
                                f"expected {QUEUES} each")
            rest = w["per_refresh"] - seen["held_counts"]
            if not QUEUES + 1 <= rest <= QUEUES + 2.5:
                failures.append(f"airflow-api: {rest:.1f} requests per refresh besides the held counts, "
                                f"expected {QUEUES + 2}")
        s.daemon.stop()

        check = promtool("check", "metrics", stdin=s_metrics_text(work, s, fake_url, token))
        problems = (check.stdout + check.stderr).strip()
        print(f"\npromtool check metrics: {'clean' if check.returncode == 0 and not problems else problems}")
        if check.returncode != 0 or problems:
            failures.append("promtool check metrics")

        # ---- postgres source against a private cluster -----------------------------------
        pg = PostgresCluster(work / "pg").start()
        pg.psql("CREATE TABLE task_instance (id serial PRIMARY KEY, queue varchar(256), state varchar(20), "
                "pool_slots integer NOT NULL DEFAULT 1, queued_dttm timestamptz DEFAULT now(), hostname varchar(1000) DEFAULT '')",
                database=pg.database)
        pg.psql("CREATE INDEX ti_state ON task_instance (state)", database=pg.database)
        pg.psql(f"INSERT INTO task_instance (queue, state) SELECT 'queue-' || lpad((i % {QUEUES})::text, 2, '0'), "
                "(ARRAY['queued','running','success','success','failed'])[1 + i % 5] FROM generate_series(1, 20000) i",
                database=pg.database)
        pg.psql("ANALYZE task_instance", database=pg.database)
        ro_password = secrets.token_hex(12)
        pg.psql(f"CREATE ROLE sentinel_ro LOGIN PASSWORD '{ro_password}'")
        pg.psql("GRANT SELECT ON task_instance TO sentinel_ro", database=pg.database)
        scans = lambda: {"scans": int(pg.psql(  # noqa: E731
            "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'task_instance'",
            database=pg.database).strip())}
        url = f"postgres://sentinel_ro:{ro_password}@127.0.0.1:{pg.port}/{pg.database}"
        sp = Sentinel(work, "sentinel-postgres", {"type": "postgres", "postgres": {"sslMode": "disable"}},
                      {"ASTRO_SENTINEL_POSTGRES_URL": url}, token).start()
        daemons.append(sp.daemon)
        status, body = http_get(f"{sp.base}/v1/workers/astro-worker-007", token)
        assert status == 200, body
        presult = {}

        def pload():
            presult.update(run_wrk(sp.base, token, lua, DURATION))

        ploaded = upstream_window(sp, DURATION, pload, scans)
        pidle = upstream_window(sp, DURATION, None, scans)
        print("\nupstream cost, postgres source (SQL queries per refresh; 1 for all queues expected)")
        for label, w in (("under load", ploaded), ("idle", pidle)):
            print(f"  {label:<11} {w['per_refresh']:6.1f} per refresh (PostgreSQL's scan counters "
                  f"of task_instance moved {w['seen_per_refresh']['scans']:.1f}), {w['refreshes']:.0f} refreshes, "
                  f"{w['served']:,.0f} HTTP requests served")
        print(f"  (same cached path under load: {presult['rps']:,.0f} requests/s, p99 {presult['p99_us'] / 1000:.3f} ms)")
        for w in (ploaded, pidle):
            if abs(w["per_refresh"] - 1) > 0.1:
                failures.append(f"postgres: {w['per_refresh']:.2f} queries per refresh, expected 1")
    finally:
        for d in reversed(daemons):
            d.stop()
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)

    print("\nresult:", "all targets met" if not failures else "MISSED: " + "; ".join(failures))
    return 1 if failures else 0


def s_metrics_text(work: Path, stopped: Sentinel, fake_url: str, token: str) -> str:
    """/metrics of a short-lived Sentinel that has served a few requests (the benchmark one is
    stopped by now)."""
    s = Sentinel(work, "sentinel-metrics", {"type": "airflow-api", "airflowApi": {"url": fake_url}},
                 {"ASTRO_SENTINEL_AIRFLOW_TOKEN": "fake"}, token).start()
    try:
        http_get(f"{s.base}/v1/workers/astro-worker-001", token)
        http_get(f"{s.base}/v1/workers/nope", token)
        http_get(f"{s.base}/v1/workers/astro-worker-001", None)
        return s.metrics()
    finally:
        s.daemon.stop()


if __name__ == "__main__":
    sys.exit(main())
