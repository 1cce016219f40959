"""KEDA's own code against the chart's output and the real astro-sentinel.

Run it with ``tests/keda/run.sh`` (it fetches Go modules, builds helm, the Sentinel and the Go
test binary, then runs this file with pytest in the tools venv).

The Go test binary (``*_test.go``, KEDA pinned in ``go.mod``) holds every check; this driver
prepares the inputs and the peers, then runs the binary once per scenario and phase:

* Scenarios: every ``tests/chart/values/*.yaml`` with KEDA workers, plus
  ``tests/keda/values/contract.yaml`` (four KEDA workers on queue ``sentinel``) and, static only,
  ``tests/keda/values/external-push.yaml`` (a worker on the external-push trigger). Each is rendered
  with the pinned helm (namespace ``astro-test``) into a temp folder; the binary's ``prepare`` tool
  writes ``scenario.json`` (what the values ask of each KEDA worker) and ``provided.yaml`` (the
  existing Secrets the values point at, with random contents), and its ``sentinel-files`` tool
  the config file and static tokens the Sentinel Pod behind the trigger URLs would see.
* KEDA's token policy: for bound-token scenarios, KEDA runs in its default token mode with the
  ``KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES`` entry the chart's NOTES print (rendered offline and
  parsed by KEDA's own loader), as a user following NOTES would install it.
* static (every scenario): KEDA's types, KEDA's admission webhook, KEDA's scale handler building
  each trigger, and the exact request KEDA's metrics-api scaler sends; for an external-push
  trigger, a mutual-TLS handshake between the certificates KEDA resolves and the Sentinel's.
* live (scenarios whose Sentinel reads Airflow's REST API): one real Airflow stack; one
  astro-sentinel per scenario started from its Pod's config file with only the Airflow URL,
  credentials, token-file path and listen address rewritten (plus, for bound tokens, the address
  of the fake Kubernetes API the Go binary serves). Then, with nothing serving queue
  ``sentinel``: backlog 0, 30 (DAG ``e2e_queued_30``), 13 and 1 (the others set to ``skipped``
  through the REST API) → KEDA reads each backlog (plus the auth checks at 30); the api-server
  stopped until every Sentinel answers 503 → KEDA sees errors and applies its fallback; the
  api-server back → KEDA reads 1 again. Last, task slots rather than tasks: the last queued task
  skipped, DAG ``e2e_slots_mix`` queues 7 tasks of 13 slots (4 × 1 + 3 × 3) → KEDA reads 13 and
  the replicas its HPA computes are ceil(13 / syncSlots), as the Sentinel says.

Environment (set by run.sh): ``ASTRO_HELM``, ``ASTRO_SENTINEL_BIN``, ``KEDA_CONTRACT_TEST_BIN``;
optional ``KEDA_CONTRACT_CHART`` (another chart folder) and ``KEDA_CONTRACT_EXTRA_VALUES``
(``:``-separated values files added to every scenario) to see the checks fail.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from harness.airflow_stack import PASSWORD, USERNAME, AirflowStack
from harness.certs import issue, make_ca
from harness.procs import Daemon, free_port, wait_for

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

CHART = Path(os.environ.get("KEDA_CONTRACT_CHART") or ROOT / "charts" / "astro-agent")
EXTRA_VALUES = [p for p in os.environ.get("KEDA_CONTRACT_EXTRA_VALUES", "").split(os.pathsep) if p]
NAMESPACE = "astro-test"
RELEASE = "rel"
QUEUE = "sentinel"
DAG = "e2e_queued_30"
TASKS = 30
SLOTS_DAG, SLOTS_TASKS, SLOTS = "e2e_slots_mix", 7, 4 * 1 + 3 * 3
CONTRACT = "contract"
SCENARIOS = {p.stem: [p] for p in sorted((ROOT / "tests" / "chart" / "values").glob("*.yaml"))}
SCENARIOS[CONTRACT] = [HERE / "values" / "contract.yaml"]
# Static only: its live counterpart, KEDA's external-push scaler against a running Sentinel, is
# test_external_push.py.
EXTERNAL_PUSH = "external-push"
SCENARIOS[EXTERNAL_PUSH] = [HERE / "values" / "external-push.yaml"]

STATIC_TESTS = ["TestRenderedObjectsAreWhatKEDAReads", "TestKEDAAdmissionWebhookAcceptsTheChart",
                "TestKEDABuildsTheBacklogTriggers"]
BOUND_TESTS = ["TestKEDADefaultTokenModeNeedsAnAudience"]


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# SIGTERM (a CI timeout) tears everything down like Ctrl-C.
signal.signal(signal.SIGTERM, _interrupt)


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "tests" / "chart" / "pins.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def need_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run tests/keda/run.sh")
    return value


class Scenario:
    def __init__(self, name: str, folder: Path):
        self.name = name
        self.dir = folder
        self.info: dict = {}
        self.config: dict = {}
        self.sentinel: Daemon | None = None
        self.port: int | None = None
        # KEDA's operator environment as the chart's NOTES tell the user to set it.
        self.keda_env: dict[str, str] = {}

    @property
    def has_keda(self) -> bool:
        return bool(self.info.get("workers"))

    @property
    def live(self) -> bool:
        return (self.has_keda and self.name != EXTERNAL_PUSH
                and self.config.get("source", {}).get("type") == "airflow-api")

    @property
    def bound(self) -> bool:
        return bool(self.config.get("auth", {}).get("tokenReview"))

    def expected_backlog(self, worker: str, backlog: int) -> int:
        (entry,) = [w for w in self.config["workers"] if w["name"] == worker]
        return backlog if QUEUE in entry["queues"] else 0

    def save_info(self) -> None:
        (self.dir / "scenario.json").write_text(json.dumps(self.info, indent=2))

    def metrics(self) -> dict[tuple[str, str], float]:
        """``(metric, worker) -> value`` of the Sentinel's open /metrics endpoint."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for m in re.finditer(r'^(astro_sentinel_worker_\w+)\{worker="([^"]+)"\} (\S+)$', text, re.M):
            out[(m.group(1), m.group(2))] = float(m.group(3))
        return out

    def ready(self) -> bool:
        """/readyz answers 200 (the first refresh succeeded); False while it does not listen yet."""
        self.sentinel.check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return r.status == 200
        except OSError:  # refused, or an HTTP error status
            return False

    def shows(self, backlog: int | None) -> bool:
        """Every worker available with its expected backlog (``None``: every worker stale)."""
        self.sentinel.check_alive()
        m = self.metrics()
        for w in self.info["workers"]:
            if backlog is None:
                if m.get(("astro_sentinel_worker_available", w)) != 0:
                    return False
            elif (m.get(("astro_sentinel_worker_available", w)) != 1
                  or m.get(("astro_sentinel_worker_backlog", w)) != self.expected_backlog(w, backlog)):
                return False
        return True


def run_binary(args: list[str], env: dict[str, str], what: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KEDA_", "ASTRO_SENTINEL_"))}
    proc = subprocess.run([need_env("KEDA_CONTRACT_TEST_BIN"), *args], env={**clean, **env}, cwd=HERE,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-30000:]}")
    return proc.stdout


def go_tool(sc: Scenario, tool: str, **env: str) -> None:
    run_binary([], {"KEDA_CONTRACT_TOOL": tool, "KEDA_CONTRACT_SCENARIO_DIR": str(sc.dir), **env},
               f"{tool} for scenario {sc.name}")


def go_test(sc: Scenario, tests: list[str], **env: str) -> str:
    """Runs the named Go tests for one scenario; each must PASS (none skipped or missing)."""
    out = run_binary(
        ["-test.v", "-test.count=1", "-test.run", "^(" + "|".join(tests) + ")$"],
        {"KEDA_CONTRACT_SCENARIO_DIR": str(sc.dir), "KEDA_CHECK_UNEXPECTED_SCALERS_PARAMS": "enabled",
         "KEDA_CLUSTER_OBJECT_NAMESPACE": sc.info["clusterObjectNamespace"], **sc.keda_env, **env},
        f"KEDA contract tests {tests} for scenario {sc.name}")
    print(f"\n---- scenario {sc.name}: {' '.join(tests)} {env or ''}\n"
          + "\n".join(line for line in out.splitlines() if not line.startswith("keda: ")))
    for t in tests:
        assert re.search(rf"^--- PASS: {t} ", out, re.M), f"{t} did not pass:\n{out}"
    return out


def keda_env_from_notes(helm: str, args: list[str], work: Path) -> dict[str, str]:
    """The operator environment NOTES.txt tells the user to give KEDA (the `env:` block of KEDA's
    chart values), rendered offline: `helm template` skips NOTES, so a copy of the chart renders
    it through `tpl` inside a ConfigMap."""
    chart = work / "chart-with-notes"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "notes-under-test.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | quote }}\n')
    cmd = [helm, "template", RELEASE, str(chart), *args, "--show-only", "templates/zz-notes.yaml"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "KUBECONFIG": os.devnull})
    assert proc.returncode == 0, f"NOTES:\n{proc.stderr}"
    notes = yaml.safe_load(proc.stdout)["data"]["notes"]
    shutil.rmtree(chart)
    match = re.search(r"^( +)env:\n((?:\1 .*\n?)+)", notes, re.M)
    if not match:
        return {}
    block = textwrap.dedent(match.group(0))
    return {e["name"]: e["value"] for e in yaml.safe_load(block)["env"]}


def made_by_the_pre_install_job(rendered: str, folder: Path) -> str:
    """The Secrets the chart's pre-install Job (`astro-sentinel ensure-secrets`) makes, as YAML
    documents to add to the rendered ones. This stage has no API server for the Job to write to,
    so they are made here to the Job's own arguments (certificates with openssl); the real Job
    runs in the cluster stage (tests/cluster/test_install.py, test_external_push.py)."""
    jobs = [d for d in yaml.safe_load_all(rendered)
            if d and d["kind"] == "Job" and d["metadata"]["name"].endswith("-ensure-secrets")]
    if not jobs:
        return ""
    (job,) = jobs
    (container,) = job["spec"]["template"]["spec"]["containers"]
    flags: dict[str, str] = {}
    dns: list[str] = []
    for arg in container["args"][1:]:
        key, _, value = arg.partition("=")
        if key == "--external-scaler-dns-name":
            dns.append(value)
        else:
            flags[key] = value
    made: dict[str, dict[str, bytes]] = {}
    if "--keda-token-secret" in flags:
        made[flags["--keda-token-secret"]] = {"token": secrets.token_hex(24).encode()}
    if "--external-scaler-ca-secret" in flags:
        ca = make_ca(folder, "ca")
        made[flags["--external-scaler-ca-secret"]] = {"ca.crt": ca.pem_cert(), "ca.key": ca.key.read_bytes()}
        leaves = {
            "--external-scaler-server-secret": issue(ca, folder, "server", flags["--external-scaler-common-name"],
                                                     dns=tuple(dns)),
            "--external-scaler-client-secret": issue(ca, folder, "client", "keda-operator", client=True),
        }
        for flag, pair in leaves.items():
            made[flags[flag]] = {"tls.crt": pair.pem_cert(), "tls.key": pair.key.read_bytes(), "ca.crt": ca.pem_cert()}
    docs = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NAMESPACE},
             "type": "Opaque", "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
            for name, data in made.items()]
    return "".join(f"\n---\n# made by the chart's pre-install Job\n{yaml.safe_dump(d)}" for d in docs)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict[str, Scenario]:
    helm = need_env("ASTRO_HELM")
    kube_version = pins()["KUBE_VERSION"]
    base = tmp_path_factory.mktemp("keda-contract")
    out = {}
    for name, files in SCENARIOS.items():
        sc = Scenario(name, base / name)
        sc.dir.mkdir()
        files = [*files, *map(Path, EXTRA_VALUES)]
        chart_args = ["--namespace", NAMESPACE, "--kube-version", kube_version]
        for f in files:
            chart_args += ["-f", str(f)]
        args = [helm, "template", RELEASE, str(CHART), *chart_args]
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "KUBECONFIG": os.devnull})
        assert proc.returncode == 0, f"helm template {name}:\n{proc.stderr}"
        (sc.dir / "rendered.yaml").write_text(proc.stdout + made_by_the_pre_install_job(proc.stdout, sc.dir / "made"))
        go_tool(sc, "prepare", KEDA_CONTRACT_NAME=name, KEDA_CONTRACT_NAMESPACE=NAMESPACE,
                KEDA_CONTRACT_VALUES=os.pathsep.join(map(str, [CHART / "values.yaml", *files])))
        sc.info = json.loads((sc.dir / "scenario.json").read_text())
        if sc.has_keda:
            pod = sc.dir / "pod"
            pod.mkdir()
            go_tool(sc, "sentinel-files", KEDA_CONTRACT_OUT=str(pod))
            sc.config = json.loads((pod / "config.json").read_text())
            if sc.bound:
                sc.keda_env = keda_env_from_notes(helm, chart_args, sc.dir)
        out[name] = sc
    assert out[CONTRACT].live, "the contract scenario must have a live Sentinel"
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_keda_accepts_and_builds_the_rendered_objects(scenarios, name):
    sc = scenarios[name]
    if not sc.has_keda:
        pytest.skip("no KEDA worker in this scenario")
    go_test(sc, STATIC_TESTS + (BOUND_TESTS if sc.bound else []))


def start_sentinel(sc: Scenario, stack: AirflowStack) -> None:
    folder = sc.dir / "sentinel"
    folder.mkdir()
    config = copy.deepcopy(sc.config)
    config["source"]["airflowApi"]["url"] = stack.api_base
    # The chart's Sentinel also watches worker pods; that side is the cluster stage's, and this
    # stage has no API server to watch.
    config.pop("kubernetes", None)
    # Likewise the worker Pods' tokens for the queue events and people's tokens for the page,
    # which only an API server can review.
    config.get("queueEvents", {}).pop("auth", None)
    config["auth"].pop("kubernetesUsers", None)
    # The history file goes where the chart mounts its volume; here, into the scenario's folder.
    if config.get("history", {}).get("path"):
        config["history"]["path"] = str(folder / "history.bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASTRO_SENTINEL_", "KEDA_"))}
    env.update(RUST_LOG="info", ASTRO_SENTINEL_AIRFLOW_USERNAME=USERNAME, ASTRO_SENTINEL_AIRFLOW_PASSWORD=PASSWORD)
    sc.port = free_port()
    token = ""
    if config["auth"].get("staticTokensFile"):
        tokens = sc.dir / "pod" / "tokens"
        config["auth"]["staticTokensFile"] = str(tokens)
        token = tokens.read_text().split()[0]
    if sc.bound:
        kube_port, sentinel_sa_token = free_port(), "sentinel-sa-" + secrets.token_hex(16)
        token_file = folder / "sa-token"
        token_file.write_text(sentinel_sa_token)
        env.update(ASTRO_SENTINEL_KUBERNETES_API_URL=f"http://127.0.0.1:{kube_port}",
                   ASTRO_SENTINEL_KUBERNETES_TOKEN_FILE=str(token_file))
        sc.info["kubeApi"] = {"listen": f"127.0.0.1:{kube_port}", "sentinelToken": sentinel_sa_token}
    sc.info["sentinel"] = {"url": f"http://127.0.0.1:{sc.port}", "token": token}
    sc.save_info()
    (folder / "config.yaml").write_text(json.dumps(config, indent=2))  # JSON is YAML
    sc.sentinel = Daemon(f"astro-sentinel ({sc.name})",
                         [need_env("ASTRO_SENTINEL_BIN"), "--config", str(folder / "config.yaml"),
                          "--listen", f"127.0.0.1:{sc.port}"],
                         env, folder / "sentinel.log").start()


def set_states(stack: AirflowStack, run_id: str, keep: int) -> None:
    """Leaves ``keep`` of the run's queued task instances queued; the others become ``skipped``."""
    tis = sorted(ti["task_id"] for ti in stack.client.task_instances(DAG, run_id) if ti["state"] == "queued")
    for task_id in tis[keep:]:
        stack.client.request("PATCH", f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}",
                             json={"new_state": "skipped"})


def test_keda_against_the_real_sentinel(scenarios):
    # The contract scenario first: its workers are the ones whose backlog moves.
    live = sorted((sc for sc in scenarios.values() if sc.live), key=lambda sc: (sc.name != CONTRACT, sc.name))
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    stack = AirflowStack()
    try:
        stack.start()
        timings["airflow stack"] = time.monotonic() - t0
        for sc in live:
            start_sentinel(sc, stack)
        wait_for(lambda: all(sc.ready() for sc in live), 60, "every Sentinel ready",
                 on_timeout=lambda: "\n".join(f"{sc.name}:\n{sc.sentinel.tail(15)}" for sc in live))

        def reach(backlog: int | None, what: str, timeout: float) -> None:
            t = time.monotonic()
            wait_for(lambda: all(sc.shows(backlog) for sc in live), timeout, what,
                     on_timeout=lambda: "\n".join(f"{sc.name}: {sc.metrics()}\n{sc.sentinel.tail(15)}" for sc in live))
            timings[f"wait: {what}"] = time.monotonic() - t

        def keda_reads(backlog: int, *extra: str) -> None:
            t = time.monotonic()
            for sc in live:
                go_test(sc, ["TestKEDAReadsTheBacklog", *extra],
                        KEDA_CONTRACT_BACKLOG=str(backlog), KEDA_CONTRACT_QUEUE=QUEUE)
            timings[f"KEDA at backlog {backlog}{' +auth' if extra else ''}"] = time.monotonic() - t

        reach(0, "every Sentinel at backlog 0", 60)
        keda_reads(0)

        t = time.monotonic()
        run_id = stack.client.trigger(DAG)
        wait_for(lambda: stack.client.count(QUEUE, ["queued"]) == TASKS, 180, f"{TASKS} queued on {QUEUE}")
        timings[f"Airflow queues {TASKS}"] = time.monotonic() - t
        reach(TASKS, f"backlog {TASKS}", 30)
        keda_reads(TASKS, "TestKEDAAuthAgainstTheSentinel")

        for keep in (13, 1):
            set_states(stack, run_id, keep)
            wait_for(lambda: stack.client.count(QUEUE, ["queued", "running"]) == keep, 60, f"{keep} left on {QUEUE}")
            reach(keep, f"backlog {keep}", 30)
            keda_reads(keep)

        # The upstream goes away: every Sentinel must say 503 (stale), and KEDA must see an error.
        stopped = time.monotonic()
        stack.stop_api_server()
        reach(None, "every Sentinel stale (503)", 90)
        print(f"\nall Sentinels stale {time.monotonic() - stopped:.1f}s after the api-server began to stop")
        t = time.monotonic()
        for sc in live:
            go_test(sc, ["TestKEDASeesTheStaleSentinel"], KEDA_CONTRACT_STALE="1")
        timings["KEDA on stale Sentinels"] = time.monotonic() - t
        stack.start_api_server()
        reach(1, "backlog 1 after the api-server is back", 60)
        keda_reads(1)

        # Slots, not tasks: a pool of 3-slot tasks needs three times the workers.
        set_states(stack, run_id, 0)
        wait_for(lambda: stack.client.count(QUEUE, ["queued", "running"]) == 0, 60, f"0 left on {QUEUE}")
        stack.client.trigger(SLOTS_DAG)
        wait_for(lambda: stack.client.count(QUEUE, ["queued"]) == SLOTS_TASKS, 180,
                 f"{SLOTS_TASKS} queued on {QUEUE}")
        reach(SLOTS, f"backlog {SLOTS} slots ({SLOTS_TASKS} tasks)", 30)
        keda_reads(SLOTS)
    finally:
        for sc in live:
            if sc.sentinel is not None:
                sc.sentinel.stop()
        stack.stop()
        timings["total"] = time.monotonic() - t0
        print("\ntimings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    for sc in live:
        assert sc.sentinel.proc.returncode == 0, f"{sc.name}: the Sentinel did not stop cleanly:\n{sc.sentinel.tail()}"
