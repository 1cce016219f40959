"""KEDA's external-push scaler against the real astro-sentinel over a real Airflow.

Run with ``tests/keda/run.sh`` (which builds the Go test binary holding the checks, see
``push_test.go``). This driver starts one Airflow stack and two Sentinels, each with its gRPC
port for KEDA's external scaler API behind mutual TLS (certificates made here with openssl):

* the live one reads Airflow's REST API every ``KEDA_PUSH_REFRESH`` (default 1s) for worker
  ``push`` on queue ``push`` (DAG ``e2e_push_1``: one task nothing serves, so it stays queued);
* the dead one points at a port where nothing listens: every backlog stays unknown.

``test_external_push`` runs the pass/fail checks (TestExternalPushAgainstTheSentinel);
``test_certificates_rotated_under_the_running_sentinel`` then replaces the live Sentinel's
certificate, key and client CA files (new CAs for both) and runs
TestExternalPushAfterCertificateRotation once the Sentinel has applied the change.
``test_wake_up_latency_benchmark`` runs only with ``KEDA_PUSH_BENCH_TRIALS`` set (see
``benchmarks/sentinel/push_latency.sh``): queued_dttm → KEDA active for the push scaler and for
the metrics-api scaler polled every ``KEDA_PUSH_BENCH_POLL`` seconds (comma-separated).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from harness.airflow_stack import PASSWORD, USERNAME, AirflowStack
from harness.certs import issue, make_ca
from harness.procs import Daemon, free_port, wait_for

HERE = Path(__file__).resolve().parent

DAG = "e2e_push_1"
QUEUE = "push"
WORKER = "push"
SYNC_SLOTS = 4


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _interrupt)


def need_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run tests/keda/run.sh")
    return value


def start_sentinel(folder: Path, name: str, airflow_url: str, tls: dict[str, Path], refresh: str) -> tuple[Daemon, int, int, str]:
    """An astro-sentinel with its external scaler port; returns (daemon, http port, grpc port, token)."""
    folder.mkdir(parents=True)
    token = secrets.token_hex(24)
    (folder / "tokens").write_text(token + "\n")
    config = {
        "refreshInterval": refresh,
        "stalenessLimit": "30s",
        "source": {"type": "airflow-api", "airflowApi": {"url": airflow_url}},
        "auth": {"staticTokensFile": str(folder / "tokens")},
        "workers": [{"name": WORKER, "queues": [QUEUE], "syncSlots": SYNC_SLOTS}],
    }
    (folder / "config.yaml").write_text(json.dumps(config, indent=2))  # JSON is YAML
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASTRO_SENTINEL_", "KEDA_"))}
    env.update(RUST_LOG="info", ASTRO_SENTINEL_AIRFLOW_USERNAME=USERNAME, ASTRO_SENTINEL_AIRFLOW_PASSWORD=PASSWORD)
    daemon = Daemon(f"astro-sentinel ({name})", [
        need_env("ASTRO_SENTINEL_BIN"), "--config", str(folder / "config.yaml"),
        "--listen", f"127.0.0.1:{http_port}",
        "--external-scaler-listen", f"127.0.0.1:{grpc_port}",
        "--external-scaler-tls-cert", str(tls["cert"]), "--external-scaler-tls-key", str(tls["key"]),
        "--external-scaler-client-ca", str(tls["client_ca"]),
    ], env, folder / "sentinel.log").start()
    return daemon, http_port, grpc_port, token


def listening(daemon: Daemon, port: int) -> bool:
    daemon.check_alive()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def push_env(tmp_path_factory):
    """push.json for the Go tests, with an Airflow stack and both Sentinels running."""
    work = tmp_path_factory.mktemp("keda-push")
    pki = work / "pki"
    server_ca, client_ca, stranger_ca = make_ca(pki, "server-ca"), make_ca(pki, "client-ca"), make_ca(pki, "stranger-ca")
    server = issue(server_ca, pki, "server", "127.0.0.1", ips=("127.0.0.1",))
    client = issue(client_ca, pki, "keda", "keda-operator", client=True)
    stranger = issue(stranger_ca, pki, "stranger", "keda-operator", client=True)
    tls = {"cert": server.cert, "key": server.key, "client_ca": client_ca.cert}
    refresh = os.environ.get("KEDA_PUSH_REFRESH", "1s")

    stack = AirflowStack()
    daemons: list[Daemon] = []
    try:
        stack.start()
        stack.client.ensure_runnable(DAG)
        live, http_port, grpc_port, token = start_sentinel(work / "live", "live", stack.api_base, tls, refresh)
        daemons.append(live)
        dead, _, dead_grpc, _ = start_sentinel(work / "dead", "dead", f"http://127.0.0.1:{free_port()}", tls, refresh)
        daemons.append(dead)
        wait_for(lambda: listening(live, grpc_port) and listening(dead, dead_grpc), 60, "both Sentinels serving gRPC",
                 on_timeout=lambda: live.tail(20) + "\n" + dead.tail(20))
        env = {
            "scaler": f"127.0.0.1:{grpc_port}", "httpUrl": f"http://127.0.0.1:{http_port}", "token": token,
            "caCert": server_ca.cert.read_text(),
            "client": {"cert": client.cert.read_text(), "key": client.key.read_text()},
            "stranger": {"cert": stranger.cert.read_text(), "key": stranger.key.read_text()},
            "deadScaler": f"127.0.0.1:{dead_grpc}", "worker": WORKER, "syncSlots": SYNC_SLOTS,
            "airflow": {"url": stack.api_base, "username": USERNAME, "password": PASSWORD, "dag": DAG},
            "refresh": refresh,
        }
        path = work / "push.json"
        path.write_text(json.dumps(env, indent=2))
        yield path, env, daemons, (tls, http_port)
    finally:
        for d in daemons:
            d.stop()
        stack.stop()
    for d in daemons:
        assert d.proc.returncode == 0, f"{d.name} did not stop cleanly:\n{d.tail()}"


def go_test(name: str, push_json: Path, timeout: float) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KEDA_", "ASTRO_SENTINEL_"))}
    proc = subprocess.run(
        [need_env("KEDA_CONTRACT_TEST_BIN"), "-test.v", "-test.count=1", "-test.run", f"^{name}$",
         f"-test.timeout={int(timeout)}s"],
        env={**clean, "KEDA_PUSH_ENV": str(push_json), "KEDA_CHECK_UNEXPECTED_SCALERS_PARAMS": "enabled"},
        cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout + 60)
    out = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("keda: "))
    print(f"\n---- {name}\n{out}")
    assert proc.returncode == 0 and re.search(rf"^--- PASS: {name} ", proc.stdout, re.M), proc.stdout[-30000:]
    return out


def test_external_push(push_env):
    path, _, _, _ = push_env
    go_test("TestExternalPushAgainstTheSentinel", path, 600)


def test_wake_up_latency_benchmark(push_env):
    trials = int(os.environ.get("KEDA_PUSH_BENCH_TRIALS") or 0)
    if not trials:
        pytest.skip("benchmark: set KEDA_PUSH_BENCH_TRIALS (benchmarks/sentinel/push_latency.sh)")
    path, env, _, _ = push_env
    polls = [int(s) for s in os.environ.get("KEDA_PUSH_BENCH_POLL", "30").split(",") if s.strip()]
    path.write_text(json.dumps({**env, "trials": trials, "pollingIntervals": polls}, indent=2))
    out = go_test("TestWakeUpLatencyBenchmark", path, trials * (max(polls, default=0) + 90) + 120)
    summary = [line.strip() for line in out.splitlines() if "BENCH" in line]
    print(f"\nrefresh interval {env['refresh']}, {trials} trials:\n" + "\n".join(summary))


def _reloads_applied(http_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    series = 'astro_sentinel_external_scaler_certificate_reloads_total{outcome="applied"} '
    return sum(float(line[len(series):]) for line in text.splitlines() if line.startswith(series))


def test_certificates_rotated_under_the_running_sentinel(push_env, tmp_path):
    """After the checks above: new CAs, a new serving certificate and a new client CA written
    over the files the running Sentinel was started with (each by a rename, as a Secret volume
    changes); KEDA's scaler with the new TriggerAuthentication is served, the old client
    certificate and the old server CA are not."""
    _, env, _, (tls, http_port) = push_env
    server_ca, client_ca = make_ca(tmp_path, "server-ca-2"), make_ca(tmp_path, "client-ca-2")
    server = issue(server_ca, tmp_path, "server", "127.0.0.1", ips=("127.0.0.1",))
    client = issue(client_ca, tmp_path, "keda", "keda-operator", client=True)
    for target, source in ((tls["cert"], server.cert), (tls["key"], server.key), (tls["client_ca"], client_ca.cert)):
        staged = target.with_suffix(".staged")
        shutil.copyfile(source, staged)
        os.replace(staged, target)
    wait_for(lambda: _reloads_applied(http_port) >= 1, 30, "the live Sentinel applying the new certificates")
    rotated = {**env, "caCert": server_ca.cert.read_text(), "oldCaCert": env["caCert"],
               "client": {"cert": client.cert.read_text(), "key": client.key.read_text()},
               "stranger": env["client"]}
    rotated_path = tmp_path / "push-rotated.json"
    rotated_path.write_text(json.dumps(rotated, indent=2))
    go_test("TestExternalPushAfterCertificateRotation", rotated_path, 120)
