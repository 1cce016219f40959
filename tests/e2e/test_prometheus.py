"""The HPA path proven with a real Prometheus: scrape, adapter rule, alerts, dashboard.

A real Prometheus (Debian's package, see :mod:`harness.prometheus_server`) scrapes every second:

* three real astro-agents that belong to two worker "Deployments": ``astro-worker-prom-a``
  (two agents on queue ``qa``, 2 slots each) and ``astro-worker-prom-b`` (one agent on ``qb``,
  3 slots). As the chart's ServiceMonitor does with ``jobLabel: deploymentName``, a static config
  relabels each target's ``deploymentName`` label into ``job``, and sets ``namespace``, ``pod``
  and ``container`` as Kubernetes service discovery would;
* a real astro-sentinel serving both Deployments (for its metrics, the alerts and the dashboard);

and loads the chart's alerting rules (charts/astro-agent/files/prometheus-rules.yaml).

DAGs ``e2e_queue_a`` (10 tasks x 30 s on ``qa``) and ``e2e_queue_b`` (10 x 30 s on ``qb``) run
against the real Airflow stack, so both queues have tasks queued and running at once.

The prometheus-adapter rule is taken exactly as the chart ships it (prometheus-adapter-values.yaml):
its ``seriesQuery`` goes through Prometheus' series API as the adapter's discovery does, and its
``metricsQuery`` is expanded as prometheus-adapter v0.12 does for an object request on one
Deployment, then run through the query API and compared with queued + running from Airflow's
REST API, while tasks are queued and running and then as they finish.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.airflow_stack import PASSWORD, USERNAME
from harness.astro_agent_process import AstroAgent, binary
from harness.procs import Daemon, free_port, wait_for
from harness.prometheus_server import PrometheusServer, PromQLError, promtool

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "astro-agent"
RULES_FILE = CHART / "files" / "prometheus-rules.yaml"
RULES_TEST_FILE = CHART / "files" / "prometheus-rules.test.yaml"
DASHBOARD_FILE = CHART / "files" / "dashboards" / "astro-agent-worker.json"

NAMESPACE = "astro-e2e"
SENTINEL_JOB = "astro-sentinel"  # the chart's Sentinel Service carries deploymentName: <prefix>-sentinel


@dataclass(frozen=True)
class Worker:
    deployment: str
    queues: tuple[str, ...]
    pods: int
    sync_slots: int
    dag: str
    tasks: int


WORKERS = (
    Worker("astro-worker-prom-a", ("qa",), pods=2, sync_slots=2, dag="e2e_queue_a", tasks=10),
    Worker("astro-worker-prom-b", ("qb",), pods=1, sync_slots=3, dag="e2e_queue_b", tasks=10),
)


def _yaml():
    try:
        import yaml
    except ImportError:
        pytest.fail("PyYAML is missing from the tools venv: list tests/requirements-prometheus.txt "
                    "for 'tools' in tests/lib/venvs.sh")
    return yaml


# ---- the prometheus-adapter rule, as shipped and as the adapter expands it -------------------


def shipped_adapter_rule() -> dict:
    """The queue-depth rule (the other shipped rule, the Sentinel's pre-warm series, is proven
    with the real adapter on the control plane: tests/cluster/test_hpa_path.py)."""
    shipped = _yaml().safe_load((CHART / "prometheus-adapter-values.yaml").read_text())
    (rule,) = [r for r in shipped["rules"]["custom"]
               if r["name"]["as"] == "astro_agent_client_queued_or_running_tasks"]
    return rule


def resource_labels(rule: dict) -> tuple[str, str]:
    """(label for namespaces, label for deployments) from the rule's resources.overrides."""
    by_resource = {v["resource"]: label for label, v in rule["resources"]["overrides"].items()}
    return by_resource["namespace"], by_resource["deployment"]


def expand_metrics_query(template: str, series: str, namespace_label: str, namespace: str,
                         resource_label: str, name: str) -> str:
    """What prometheus-adapter v0.12 (pkg/naming/metrics_query.go, Build) renders for the object
    request .../namespaces/<namespace>/deployments.apps/<name>/<metric> without a metric selector:
    a Go template with << >> delimiters where .Series is the discovered series name,
    .LabelMatchers the namespace matcher then the resource matcher, each label="value" (Go %q),
    joined by ',', and .GroupBy the resource label."""
    def q(value: str) -> str:  # Go's %q for the ASCII names used here
        return json.dumps(value)

    args = {
        "Series": series,
        "LabelMatchers": f"{namespace_label}={q(namespace)},{resource_label}={q(name)}",
        "GroupBy": resource_label,
    }
    out = re.sub(r"<<\s*\.(\w+)\s*>>", lambda m: args[m.group(1)], template)
    assert "<<" not in out and ">>" not in out, f"template construct this test does not expand: {template}"
    return out


def adapter_metric_name(rule: dict, series: str) -> str:
    """name.matches / name.as applied to the series name (Go's Regexp.ReplaceAllString)."""
    return re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${", "\\g<").replace("}", ">"), series)


# ---- the scenario: Prometheus, three agents, the Sentinel, two DAG runs ----------------------


class Sentinel:
    def __init__(self, folder: Path, airflow_api: str):
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "refreshInterval": "1s",
            "stalenessLimit": "30s",
            "source": {"type": "airflow-api", "airflowApi": {"url": airflow_api}},
            "auth": {"disabled": True},
            "workers": [
                {"name": w.deployment, "queues": list(w.queues), "syncSlots": w.sync_slots,
                 "minReplicas": 1, "maxReplicas": w.pods}
                for w in WORKERS
            ],
        }
        (folder / "sentinel.yaml").write_text(json.dumps(config, indent=2))  # JSON is YAML
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRO_SENTINEL_")}
        env.update(RUST_LOG="info", ASTRO_SENTINEL_AIRFLOW_USERNAME=USERNAME, ASTRO_SENTINEL_AIRFLOW_PASSWORD=PASSWORD)
        self.daemon = Daemon(
            "astro-sentinel",
            [str(binary("astro-sentinel")), "--config", str(folder / "sentinel.yaml"),
             "--listen", f"127.0.0.1:{self.port}"],
            env, folder / "sentinel.log",
        )

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> "Sentinel":
        def up():
            self.daemon.check_alive()
            try:
                with urllib.request.urlopen(self.admin + "/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        self.daemon.start()
        wait_for(up, timeout, "astro-sentinel to listen", on_timeout=self.daemon.tail)
        return self

    def metrics(self) -> str:
        with urllib.request.urlopen(self.admin + "/metrics", timeout=10) as r:
            return r.read().decode()


def prometheus_config(agents: dict[str, list[AstroAgent]], sentinel: Sentinel) -> dict:
    """Static configs equivalent to the chart's ServiceMonitors: the Service label deploymentName
    becomes `job`; namespace/pod/container as Kubernetes service discovery sets them."""
    to_job = [
        {"source_labels": ["deploymentName"], "target_label": "job"},
        {"action": "labeldrop", "regex": "deploymentName"},
    ]
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES_FILE)],
        "scrape_configs": [
            {
                "job_name": "astro-agent-workers",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{a.port}"],
                     "labels": {"deploymentName": deployment, "namespace": NAMESPACE, "pod": a.name, "container": "agent"}}
                    for deployment, pods in agents.items() for a in pods
                ],
                "relabel_configs": to_job,
            },
            {
                "job_name": "astro-sentinel-static",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{sentinel.port}"],
                     "labels": {"deploymentName": SENTINEL_JOB, "namespace": NAMESPACE, "pod": "astro-sentinel-0",
                                "container": "sentinel"}}
                ],
                "relabel_configs": to_job,
            },
        ],
    }


@dataclass
class Scenario:
    prom: PrometheusServer
    agents: dict[str, list[AstroAgent]]
    sentinel: Sentinel
    runs: dict[str, str]
    started: float


@pytest.fixture(scope="module")
def scenario(airflow):
    folder = Path(tempfile.mkdtemp(prefix="astro-e2e-prom-"))
    agents = {
        w.deployment: [AstroAgent(airflow, f"{w.deployment}-{i}", queues=w.queues, sync_slots=w.sync_slots)
                       for i in range(w.pods)]
        for w in WORKERS
    }
    sentinel = Sentinel(folder / "sentinel", airflow.api_base)
    prom = PrometheusServer(prometheus_config(agents, sentinel), folder=folder / "prometheus")
    runs: dict[str, str] = {}
    try:
        prom.start()
        sentinel.start()
        for pods in agents.values():
            for a in pods:
                a.start(timeout=300)
        t0 = time.monotonic()
        for w in WORKERS:
            runs[w.dag] = airflow.client.trigger(w.dag)
        yield Scenario(prom, agents, sentinel, runs, t0)
    finally:
        for dag_id, run in runs.items():
            try:
                airflow.abandon_run(dag_id, run)
            except Exception as e:  # the stack may be half-down after a failure
                print(f"could not clean up {dag_id}/{run}: {e}")
        for pods in agents.values():
            for a in pods:
                a.drain_then_stop()
        sentinel.daemon.stop()
        prom.stop()
        if not os.environ.get("ASTRO_E2E_KEEP"):
            shutil.rmtree(folder, ignore_errors=True)


def airflow_counts(client, queues) -> tuple[int, int]:
    return (sum(client.count(q, ["queued"]) for q in queues), sum(client.count(q, ["running"]) for q in queues))


def one_value(result: list[dict], want_metric: dict | None = None) -> float | None:
    """The value of a one-sample result (None when empty)."""
    if not result:
        return None
    assert len(result) == 1, result
    if want_metric is not None:
        assert result[0]["metric"] == want_metric, result
    return float(result[0]["value"][1])


# ---- 1. the adapter rule against Airflow's counts ---------------------------------------------


@dataclass
class Observation:
    t: float
    deployment: str
    queued: int
    running: int
    stable: bool
    rule: float | None
    summed: float | None
    pods: float | None

    @property
    def backlog(self) -> int:
        return self.queued + self.running

    @property
    def matches(self) -> bool:
        return self.stable and self.rule == self.backlog

    def row(self) -> str:
        fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
        return (f"{self.t:7.1f}s  {self.deployment:<22} airflow queued={self.queued:<3} running={self.running:<3} "
                f"(q+r={self.backlog:<3}{'' if self.stable else ' moving'})  rule={fmt(self.rule):<4} "
                f"naive-sum={fmt(self.summed):<4} pods={fmt(self.pods)}")


def test_adapter_rule_equals_airflows_queued_plus_running_not_times_the_pods(airflow, scenario):
    prom, client = scenario.prom, airflow.client
    rule = shipped_adapter_rule()
    ns_label, deploy_label = resource_labels(rule)
    assert (ns_label, deploy_label) == ("namespace", "job")

    # Discovery, as the adapter does it: the seriesQuery over the series API. Every agent's series
    # is there, with the Deployment in `job` (relabelled) and a namespace and pod.
    want_pods = {a.name: d for d, pods in scenario.agents.items() for a in pods}

    def discovered():
        found = prom.series(rule["seriesQuery"])
        pods = {s.get("pod"): s.get("job") for s in found}
        return found if pods == want_pods else None

    series = wait_for(discovered, 300, "the seriesQuery to find every agent's queue stats", interval=1,
                      on_timeout=lambda: json.dumps(prom.targets(), indent=1)[:3000])
    assert {s["__name__"] for s in series} == {"astro_agent_client_queue_stats"}
    assert {s["namespace"] for s in series} == {NAMESPACE}
    series_name = "astro_agent_client_queue_stats"
    metric = adapter_metric_name(rule, series_name)
    chart_values = _yaml().safe_load((CHART / "values.yaml").read_text())
    assert metric == chart_values["workerDefaults"]["hpa"]["metric"]["name"] == "astro_agent_client_queued_or_running_tasks"

    queries = {
        w.deployment: expand_metrics_query(rule["metricsQuery"], series_name, ns_label, NAMESPACE, deploy_label, w.deployment)
        for w in WORKERS
    }
    for d, q in queries.items():
        print(f"\nadapter query for deployments.apps/{d} in {NAMESPACE}:\n  {q}")

    observations: list[Observation] = []

    def observe(w: Worker) -> Observation:
        before = airflow_counts(client, w.queues)
        sel = f'{series_name}{{{ns_label}="{NAMESPACE}",{deploy_label}="{w.deployment}"'
        at = time.time()
        rule_value = one_value(prom.query(queries[w.deployment], at=at), {deploy_label: w.deployment})
        # What a rule without the de-duplication would say, and how many Pods report.
        summed = one_value(prom.query(f'sum({sel},state=~"queued|running"}})', at=at))
        pods = one_value(prom.query(f'count({sel},state="queued"}})', at=at))
        after = airflow_counts(client, w.queues)
        o = Observation(time.monotonic() - scenario.started, w.deployment, after[0], after[1], before == after,
                        rule_value, summed, pods)
        observations.append(o)
        return o

    def report() -> str:
        return "\n".join(o.row() for o in observations[-40:])

    # Phase 1: tasks queued and running on both queues; the rule equals queued + running, while
    # the Pods' series added up would be `pods` times that.
    proven: dict[str, Observation] = {}

    def both_proven():
        for w in WORKERS:
            if w.deployment in proven:
                continue
            o = observe(w)
            if (o.matches and o.queued > 0 and o.running > 0 and o.pods == w.pods
                    and o.summed == w.pods * o.backlog):
                proven[w.deployment] = o
        return len(proven) == len(WORKERS)

    wait_for(both_proven, 900, "the adapter rule to equal Airflow's queued + running on both queues",
             interval=0.5, on_timeout=report)
    print("\nrule value next to Airflow's counts, tasks queued and running:")
    for o in proven.values():
        print("  " + o.row())

    # Phase 2: the rule follows the counts as tasks finish, down to 0.
    followed: dict[str, list[Observation]] = {w.deployment: [proven[w.deployment]] for w in WORKERS}

    def all_done():
        done = True
        for w in WORKERS:
            o = observe(w)
            seen = followed[w.deployment]
            if o.matches and o.rule != seen[-1].rule:
                seen.append(o)
            finished = client.dag_run(w.dag, scenario.runs[w.dag])["state"] in ("success", "failed")
            done = done and finished and seen[-1].rule == 0
        return done

    wait_for(all_done, 1200, "both runs to finish and the rule to follow the counts to 0", interval=0.5,
             on_timeout=report)
    print("\nthe rule following Airflow's counts as tasks finish:")
    for w in WORKERS:
        for o in followed[w.deployment]:
            print("  " + o.row())

    # Where the rule said more than Airflow's (steady) count: lag (the agents refresh every 2 s,
    # Prometheus scrapes every 1 s, tasks finish in Airflow first). The agent reads queued +
    # running as one count, so a task that starts during a read is not counted twice.
    above = [o for o in observations if o.stable and o.rule is not None and o.rule > o.backlog]
    if above:
        print("\nrule above Airflow's count (refresh/scrape lag):")
        for o in above:
            print("  " + o.row())

    for w in WORKERS:
        values = [o.rule for o in followed[w.deployment]]
        assert values[0] > 0 and values[-1] == 0, values
        assert len(set(values)) >= 3, f"{w.deployment}: the rule matched Airflow at only {values}"
        # Never the backlog times the Pods: no value above the tasks that exist on the queue, but
        # for that read skew. (Times two Pods, Deployment a's would have read 20.)
        worst = max(o.rule for o in observations if o.deployment == w.deployment and o.rule is not None)
        bound = w.tasks + w.pods * w.sync_slots
        assert worst <= bound, f"{w.deployment}: rule said {worst} with only {w.tasks} tasks on its queues\n{report()}"
        run = scenario.runs[w.dag]
        states = {t["task_id"]: t["state"] for t in client.task_instances(w.dag, run)}
        assert set(states.values()) == {"success"}, states


# ---- 2. promtool check metrics ----------------------------------------------------------------


def test_promtool_check_metrics_reports_nothing_for_agent_and_sentinel(scenario):
    # A control: promtool does report a badly named counter.
    bad = promtool("check", "metrics", stdin="# HELP astro_bad A counter.\n# TYPE astro_bad counter\nastro_bad 1\n")
    assert bad.returncode != 0 and "_total" in bad.stdout + bad.stderr, bad

    agent = scenario.agents[WORKERS[0].deployment][0]
    # Wait until the body has every kind of series (a finished task brings the duration histogram).
    wait_for(lambda: "astro_agent_task_duration_seconds_bucket" in agent.metrics(), 900,
             "a finished task in the agent's metrics", interval=2)
    bodies = {f"agent {a.name}": a.metrics() for pods in scenario.agents.values() for a in pods}
    bodies["sentinel"] = scenario.sentinel.metrics()
    assert "astro_agent_client_queue_stats{" in bodies[f"agent {agent.name}"]
    assert "astro_sentinel_worker_available{" in bodies["sentinel"]
    # The pool alerts' bounds (the replica and pod gauges need a kubernetes section: absent here).
    assert 'astro_sentinel_worker_max_replicas{worker="astro-worker-prom-a"} 2' in bodies["sentinel"]
    assert "astro_sentinel_worker_replicas{" not in bodies["sentinel"]
    for what, body in bodies.items():
        proc = promtool("check", "metrics", stdin=body)
        assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", (
            f"promtool check metrics on the {what}'s /metrics:\n{proc.stdout}{proc.stderr}")


# ---- 3. the alerting rules --------------------------------------------------------------------


def test_alert_rules_pass_promtool_check_and_unit_tests():
    check = promtool("check", "rules", str(RULES_FILE))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 9 rules found" in check.stdout
    test = promtool("test", "rules", RULES_TEST_FILE.name, cwd=RULES_TEST_FILE.parent)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_live_prometheus_evaluates_every_alert_rule_without_error(scenario):
    prom = scenario.prom
    shipped = {r["alert"] for g in _yaml().safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]}

    def evaluated():
        rules = {r["name"]: r for g in prom.rule_groups() for r in g["rules"]}
        return rules if set(rules) == shipped and all(r["health"] == "ok" for r in rules.values()) else None

    rules = wait_for(evaluated, 120, "every rule evaluated with health ok", interval=1,
                     on_timeout=lambda: json.dumps(prom.rule_groups(), indent=1)[:4000])
    # The Sentinel is up and scraped: its down alert must stay quiet.
    assert rules["AstroSentinelDown"]["state"] == "inactive", rules["AstroSentinelDown"]
    assert one_value(prom.query(f'up{{job="{SENTINEL_JOB}"}}')) == 1.0


# ---- 4. the dashboard's queries ---------------------------------------------------------------


def substitute(expr: str, deployment: str) -> str:
    return (expr.replace("$__rate_interval", "30s").replace("$namespace", NAMESPACE)
            .replace("$deployment", deployment))


def kube_state_metrics_only(expr: str) -> bool:
    return bool(re.search(r"\bkube_", expr)) and not re.search(r"\bastro_", expr)


def test_every_dashboard_query_parses_and_returns_series(scenario):
    prom = scenario.prom
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    deployment = WORKERS[0].deployment

    # The control: a query that does not parse is reported as an error.
    with pytest.raises(PromQLError):
        prom.query('sum(astro_agent_slots{job="x"')

    # Template variables (Grafana's label_values(selector, label)) list our namespace and Deployments.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name, want in (("namespace", {NAMESPACE}), ("deployment", {w.deployment for w in WORKERS})):
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variables[name]["query"]["query"])
        assert m, variables[name]
        values = set(prom.label_values(m.group(2), substitute(m.group(1), deployment)))
        assert want <= values, (name, values)

    targets = [(p["title"], t["refId"], substitute(t["expr"], deployment))
               for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(targets) >= 20
    parse_only = [t for t in targets if kube_state_metrics_only(t[2])]
    need_series = [t for t in targets if not kube_state_metrics_only(t[2])]
    assert {re.search(r"\bkube_\w+", e).group(0) for _, _, e in parse_only} >= {
        "kube_deployment_spec_replicas", "kube_horizontalpodautoscaler_status_desired_replicas"}

    for title, ref, expr in parse_only:
        prom.query(expr)  # raises PromQLError unless it parses and evaluates

    # Every agent/Sentinel query returns series (some only once a task has finished: poll).
    missing: list[str] = []

    def all_return_series():
        missing.clear()
        for title, ref, expr in need_series:
            if not prom.query(expr):
                missing.append(f"{title} [{ref}]: {expr}")
        return not missing

    wait_for(all_return_series, 900, "every agent/Sentinel panel query to return series", interval=2,
             on_timeout=lambda: "\n".join(missing))
    print(f"\n{len(need_series)} dashboard queries returned series; "
          f"{len(parse_only)} kube-state-metrics queries parsed (no kube-state-metrics here):")
    for title, ref, expr in parse_only:
        print(f"  {title} [{ref}]: {expr}")

    # The dashboard's backlog is the adapter's number.
    rule = shipped_adapter_rule()
    ns_label, deploy_label = resource_labels(rule)
    adapter = expand_metrics_query(rule["metricsQuery"], "astro_agent_client_queue_stats", ns_label, NAMESPACE,
                                   deploy_label, deployment)
    (backlog_panel,) = [p for p in dashboard["panels"] if p["title"] == "Backlog vs capacity"]
    backlog = substitute(backlog_panel["targets"][0]["expr"], deployment)
    at = time.time()
    assert one_value(prom.query(backlog, at=at)) == one_value(prom.query(adapter, at=at)) is not None
    # Capacity is replicas x syncSlots.
    w = WORKERS[0]
    (capacity,) = [substitute(t["expr"], deployment) for t in backlog_panel["targets"] if "capacity" in t["legendFormat"]]
    assert one_value(prom.query(capacity)) == w.pods * w.sync_slots
