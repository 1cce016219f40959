"""TLS against real TLS endpoints, with a private CA made for the test.

PostgreSQL (Debian's server, ``ssl = on``, a server certificate for 127.0.0.1 only, signed by a
test CA), read by the Sentinel's ``postgres`` source:

* the default ``sslMode`` is ``verify-full``: with ``caFile`` set to the test CA it reads the
  backlog over TLS; with another CA, or through a host name the certificate does not carry,
  it reads nothing (503 with the certificate error) — ``verify-ca`` accepts that host name;
* refused at start (exit 2, one line naming the field): ``verify-full`` without ``caFile``, and a
  URL whose ``sslmode=`` disagrees with the file.

An https Airflow (a second ``airflow api-server`` of the session's stack, started with
``--ssl-cert``/``--ssl-key``):

* ``astro-agent --ca-file`` registers over https, runs a task and reads queue stats over https;
  without ``--ca-file`` it never gets ready and its log names the certificate problem;
* ``astro-sentinel`` with ``ASTRO_SENTINEL_CA_FILE`` reads the counts over https; without it
  answers 503 naming the certificate problem.

The task processes still reach the Execution API over the stack's plain http address: they
are Airflow's own Python code, configured by Airflow, not by the agent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests

from harness.astro_agent_process import AstroAgent
from harness.postgres import PostgresCluster
from harness.procs import Daemon, free_port, wait_for

from certificates import make_certificates
from test_sentinel import QUEUE, WORKER, Sentinel, backlog_of, sentinel_bin  # noqa: F401 (a fixture)

TLS_QUEUE = "tls"
CERTIFICATE_ERROR = "invalid peer certificate"  # rustls' words for every rejected certificate


def private_folder(prefix: str) -> Path:
    """A temp folder the ``postgres`` user can traverse (pytest's tmp_path is 0700 root's)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(folder, 0o711)
    return folder


def last_error(sentinel: Sentinel) -> str | None:
    """The queue's last refresh error while the worker answers 503, else None."""
    status, body = sentinel.worker()
    if status != 503:
        return None
    errors = [q.get("lastError") for q in body.get("queueStatus", []) if q.get("lastError")]
    return errors[0] if errors else None


def refused(binary: Path, folder: Path, source: dict, env: dict[str, str]) -> tuple[int, str]:
    """Runs the Sentinel with this source until it exits; returns (exit code, stderr)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "sentinel.yaml"
    config.write_text(json.dumps({"source": source, "auth": {"disabled": True},
                                  "workers": [{"name": WORKER, "queues": [QUEUE]}]}))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASTRO_SENTINEL_")}
    result = subprocess.run([str(binary), "--config", str(config), "--listen", f"127.0.0.1:{free_port()}"],
                            env={**clean, **env}, capture_output=True, text=True, timeout=20)
    return result.returncode, result.stderr


# ---- PostgreSQL with ssl = on -------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_postgres():
    """A PostgreSQL cluster of its own with TLS on and a 3-task backlog on the queue; yields
    (cluster, the CA that signed its certificate, an unrelated CA)."""
    folder = private_folder("astro-e2e-tls-pg-")
    ca, crt, key = make_certificates(folder / "certs")
    other_ca, _, _ = make_certificates(folder / "other-certs", ca_name="astro-e2e-other-ca")
    pg = PostgresCluster(folder / "pg")
    try:
        pg.start()
        pg.enable_tls(crt, key)
        # Only the columns the backlog query reads: the Sentinel's other questions (cold starts,
        # Edge workers) then fail on their own, never taking the backlog with them.
        for sql in (
            "CREATE TABLE task_instance (queue text, state text, hostname text, pool_slots int, "
            "queued_dttm timestamptz DEFAULT now())",
            f"INSERT INTO task_instance VALUES ('{QUEUE}', 'queued', '', 1), ('{QUEUE}', 'queued', '', 1), "
            f"('{QUEUE}', 'queued', '', 1)",
            f"GRANT SELECT ON task_instance TO {pg.user}",
        ):
            pg.psql(sql, database=pg.database)
        yield pg, ca, other_ca
    finally:
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def sentinels():
    started: list[Sentinel] = []
    yield started
    for s in started:
        s.stop()


def test_postgres_checks_the_certificate_by_default(tls_postgres, sentinel_bin, sentinels, tmp_path):
    pg, ca, other_ca = tls_postgres
    by_ip = pg.url  # postgres://…@127.0.0.1:port/db: the name the certificate carries
    by_name = by_ip.replace("@127.0.0.1:", "@localhost:")  # same server, a name it does not carry

    def start(name: str, postgres: dict, url: str) -> Sentinel:
        s = Sentinel(sentinel_bin, tmp_path / name, {"type": "postgres", "postgres": postgres},
                     {"ASTRO_SENTINEL_POSTGRES_URL": url})
        sentinels.append(s)
        return s.start()

    # No sslMode: verify-full is the default.
    trusted = start("trusted", {"caFile": str(ca)}, by_ip)
    wrong_ca = start("wrong-ca", {"caFile": str(other_ca)}, by_ip)
    wrong_name = start("wrong-name", {"caFile": str(ca)}, by_name)
    chain_only = start("verify-ca", {"sslMode": "verify-ca", "caFile": str(ca)}, by_name)

    for s in (trusted, chain_only):
        wait_for(lambda: s.backlog() == 3, 30, f"backlog 3 from {s.folder.name}",
                 on_timeout=lambda: f"{s.worker()}\n{s.daemon.tail()}")
    encrypted = pg.psql("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                        f"WHERE a.usename = '{pg.user}' AND s.ssl")
    assert int(encrypted.strip()) >= 2, "the Sentinel's connections are not encrypted"

    unknown_issuer = wait_for(lambda: last_error(wrong_ca), 30, "the wrong CA to be refused",
                              on_timeout=wrong_ca.daemon.tail)
    print(f"another CA: {unknown_issuer}")
    assert CERTIFICATE_ERROR in unknown_issuer and "UnknownIssuer" in unknown_issuer, unknown_issuer
    not_for_name = wait_for(lambda: last_error(wrong_name), 30, "the wrong host name to be refused",
                            on_timeout=wrong_name.daemon.tail)
    print(f"a name the certificate does not carry: {not_for_name}")
    assert CERTIFICATE_ERROR in not_for_name and "localhost" in not_for_name, not_for_name
    # Still failing, never a made-up value.
    assert wrong_ca.worker()[0] == 503 and wrong_name.worker()[0] == 503


def test_postgres_tls_mistakes_are_refused_at_start(tls_postgres, sentinel_bin, tmp_path):
    pg, ca, _ = tls_postgres
    code, stderr = refused(sentinel_bin, tmp_path / "no-ca", {"type": "postgres"},
                           {"ASTRO_SENTINEL_POSTGRES_URL": pg.url})
    assert code == 2, stderr
    assert "source.postgres.caFile" in stderr and "verify-full" in stderr, stderr

    code, stderr = refused(sentinel_bin, tmp_path / "url-disagrees",
                           {"type": "postgres", "postgres": {"caFile": str(ca)}},
                           {"ASTRO_SENTINEL_POSTGRES_URL": f"{pg.url}?sslmode=disable"})
    assert code == 2, stderr
    assert "sslmode=disable conflicts with source.postgres.sslMode verify-full" in stderr, stderr
    assert pg.password not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


# ---- an https Airflow -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def https_airflow(airflow):
    """A second api-server of the session's stack, serving https with a test CA's certificate;
    yields (https base URL, the CA file)."""
    folder = private_folder("astro-e2e-tls-api-")
    ca, crt, key = make_certificates(folder / "certs")
    port = free_port()
    base = f"https://127.0.0.1:{port}"
    argv = [str(airflow.airflow_bin_dir / "airflow"), "api-server", "-H", "127.0.0.1", "-p", str(port),
            "-w", "1", "--ssl-cert", str(crt), "--ssl-key", str(key)]
    daemon = Daemon("https api-server", argv, airflow.server_env(), folder / "api-server.log", cwd=folder)

    def healthy() -> bool:
        daemon.check_alive()
        try:
            edge = requests.get(f"{base}/edge_worker/v1/health", verify=str(ca), timeout=5)
            return edge.status_code == 200
        except requests.RequestException:
            return False

    try:
        daemon.start()
        wait_for(healthy, 120, "the https api-server", interval=0.3, on_timeout=daemon.tail)
        yield base, ca
    finally:
        daemon.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_agent_trusts_its_ca_file_for_the_edge_and_rest_api(airflow, https_airflow, trigger_dag):
    base, ca = https_airflow
    agents: list[AstroAgent] = []
    try:
        untrusting = AstroAgent(airflow, "tls-no-ca", queues=[TLS_QUEUE], api_base=base)
        agents.append(untrusting)
        untrusting.daemon.start()
        line = wait_for(
            lambda: untrusting.daemon.check_alive() or next(
                (l for l in untrusting.log().splitlines() if "registration failed" in l), None),
            30, "a failed registration", on_timeout=untrusting.log)
        print(f"agent without --ca-file: {line}")
        assert CERTIFICATE_ERROR in line and "UnknownIssuer" in line, line
        assert untrusting.status("/readyz") != 200
        assert untrusting.stop(timeout=20) is not None

        agent = AstroAgent(airflow, "tls-ca", queues=[TLS_QUEUE], api_base=base,
                           extra_args=["--ca-file", str(ca)])
        agents.append(agent)
        agent.start()  # ready: registered over https
        run = trigger_dag("e2e_tls_1")
        assert airflow.client.wait_run("e2e_tls_1", run, timeout=180) == "success"
        [ti] = airflow.client.task_instances("e2e_tls_1", run)
        assert ti["hostname"] == "tls-ca"
        wait_for(lambda: agent.gauge("astro_agent_client_queue_stats", queue=TLS_QUEUE, state="queued") is not None,
                 30, "queue stats read over https", on_timeout=agent.log)
        assert agent.gauge("astro_agent_queue_stats_refresh_failures_total") == 0
    finally:
        for a in agents:
            if a.daemon.alive():
                a.stop(sig=signal.SIGTERM, timeout=60)


def test_sentinel_trusts_its_ca_file_for_the_airflow_api(https_airflow, sentinel_bin, sentinels, tmp_path):
    base, ca = https_airflow
    source = {"type": "airflow-api", "airflowApi": {"url": base}}
    login = {"ASTRO_SENTINEL_AIRFLOW_USERNAME": "admin", "ASTRO_SENTINEL_AIRFLOW_PASSWORD": "admin"}
    untrusting = Sentinel(sentinel_bin, tmp_path / "no-ca", source, login)
    trusting = Sentinel(sentinel_bin, tmp_path / "ca", source, {**login, "ASTRO_SENTINEL_CA_FILE": str(ca)})
    sentinels.extend([untrusting, trusting])
    untrusting.start()
    trusting.start()

    answer = wait_for(lambda: trusting.worker()[0] == 200 and trusting.worker()[1], 30,
                      "counts over https", on_timeout=lambda: f"{trusting.worker()}\n{trusting.daemon.tail()}")
    assert isinstance(backlog_of(answer), (int, float))
    assert trusting.metric("astro_sentinel_upstream_requests_total") >= 2
    error = wait_for(lambda: last_error(untrusting), 30, "the unknown CA to be refused",
                     on_timeout=untrusting.daemon.tail)
    print(f"sentinel without the CA: {error}")
    assert CERTIFICATE_ERROR in error and "UnknownIssuer" in error, error
