"""The chart's monitoring: the ServiceMonitors of the workers and the Sentinel, the PrometheusRule
built from files/prometheus-rules.yaml and the Grafana dashboard ConfigMap built from
files/dashboards/astro-agent-worker.json.

Rendered by the real helm, checked against the real PrometheusRule CRD and the Kubernetes schemas,
and the rendered rules run through promtool (Debian's prometheus package, found or unpacked by
tests/lib/harness/prometheus_server.py). The live checks against a real Prometheus are in
tests/e2e/test_prometheus.py.
"""

import json
import os
import pathlib
import re
import shutil

import jsonschema
import pytest
import yaml

from harness import prometheus_server

from conftest import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    PINS,
    VALID_SCENARIOS,
    _OBJECT_META,
    _closed,
    _tool,
    effective,
    scenario,
)

RULES_FILE = CHART / "files" / "prometheus-rules.yaml"
RULES_TEST_FILE = CHART / "files" / "prometheus-rules.test.yaml"
DASHBOARD_FILE = CHART / "files" / "dashboards" / "astro-agent-worker.json"

ON = ["monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true"]
SENTINEL_GROUP = "astro-sentinel"
SHIPPED_RULE_COUNT = 9


def shipped_rules():
    return yaml.safe_load(RULES_FILE.read_text())


def shipped_dashboard():
    return json.loads(DASHBOARD_FILE.read_text())


@pytest.fixture(scope="session")
def prometheusrule_schema():
    moddir = os.environ.get("ASTRO_PROMETHEUS_OPERATOR_MODULE_DIR") or _tool(
        "--mod", f"{PINS['PROMETHEUS_OPERATOR_MODULE']}@{PINS['PROMETHEUS_OPERATOR_VERSION']}"
    )
    crd = yaml.safe_load(
        (pathlib.Path(moddir) / "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml").read_text()
    )
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _closed(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = _OBJECT_META
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata", "spec"})
    return schema


def check_prometheusrule(schema, doc):
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors[:5])


# ---------------------------------------------------------------------------------------------
# Off by default; on, every object is valid.


@pytest.mark.parametrize("name", ["defaults", "hpa", "keda-static", "mixed"])
def test_nothing_rendered_unless_enabled(chart, name):
    r = chart.render(scenario(name))
    assert not r.all("PrometheusRule")
    assert not [c for c in r.all("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]


@pytest.mark.parametrize("name", ["hpa", "keda-static", "mixed"])
def test_enabled_objects_match_their_schemas(chart, validate, prometheusrule_schema, name):
    r = chart.render(scenario(name), sets=ON)
    (rule,) = r.all("PrometheusRule")
    check_prometheusrule(prometheusrule_schema, rule)
    for doc in r.docs:
        if doc["kind"] != "PrometheusRule":
            validate(doc)


def test_prometheusrule_schema_check_is_not_a_rubber_stamp(chart, prometheusrule_schema):
    (rule,) = chart.render(scenario("hpa"), sets=ON).all("PrometheusRule")
    broken = json.loads(json.dumps(rule))
    broken["spec"]["groups"][0]["rules"][0]["expression"] = broken["spec"]["groups"][0]["rules"][0].pop("expr")
    with pytest.raises(AssertionError):
        check_prometheusrule(prometheusrule_schema, broken)


@pytest.mark.parametrize("name", ["hpa", "keda-static"])
def test_helm_lint_strict_with_monitoring(chart, name):
    args = ["lint", "--strict", ".", "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, "-f", str(scenario(name))]
    for s in ON:
        args += ["--set", s]
    proc = chart.run(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# PrometheusRule: the shipped groups, the Sentinel's only with the Sentinel.


@pytest.mark.parametrize("name,sentinel", [("hpa", False), ("keda-static", True), ("mixed", True)])
def test_prometheusrule_carries_the_shipped_groups(chart, name, sentinel):
    values = yaml.safe_load(scenario(name).read_text())
    prefix = values.get("resourceNamePrefix", "astro")
    r = chart.render(scenario(name), sets=ON)
    rule = r.get("PrometheusRule", f"{prefix}-alerts", namespace=NAMESPACE)
    want = [g for g in shipped_rules()["groups"] if sentinel or g["name"] != SENTINEL_GROUP]
    assert rule["spec"]["groups"] == want
    names = [g["name"] for g in rule["spec"]["groups"]]
    assert "astro-agent" in names and (SENTINEL_GROUP in names) == sentinel


def test_prometheusrule_namespace_labels_and_alert_labels(chart):
    r = chart.render(scenario("keda-static"), sets=ON + [
        "monitoring.prometheusRule.namespace=monitoring",
        "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
        "monitoring.prometheusRule.alertLabels.team=data",
        "monitoring.prometheusRule.alertLabels.severity=page",
    ])
    (rule,) = r.all("PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "astro-agent"
    shipped = {r["alert"]: r for g in shipped_rules()["groups"] for r in g["rules"]}
    rendered = [x for g in rule["spec"]["groups"] for x in g["rules"]]
    assert sorted(x["alert"] for x in rendered) == sorted(shipped)
    for x in rendered:
        assert x["labels"] == {**shipped[x["alert"]]["labels"], "team": "data", "severity": "page"}
        assert {k: v for k, v in x.items() if k != "labels"} == {k: v for k, v in shipped[x["alert"]].items() if k != "labels"}


def test_rendered_rules_pass_promtool_and_the_unit_tests(chart, tmp_path):
    """The Helm round trip (fromYaml, toYaml) keeps every expression and annotation template: the
    rendered groups pass `promtool check rules` and the shipped unit tests."""
    (rule,) = chart.render(scenario("keda-static"), sets=ON).all("PrometheusRule")
    (tmp_path / "prometheus-rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    shutil.copy(RULES_TEST_FILE, tmp_path / "prometheus-rules.test.yaml")
    check = prometheus_server.promtool("check", "rules", "prometheus-rules.yaml", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {SHIPPED_RULE_COUNT} rules found" in check.stdout, check.stdout
    test = prometheus_server.promtool("test", "rules", "prometheus-rules.test.yaml", cwd=tmp_path)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


THRESHOLDS = [
    "monitoring.prometheusRule.thresholds.sentinelUnavailableFor=7m",
    "monitoring.prometheusRule.thresholds.poolStuckAtZeroFor=90s",
    "monitoring.prometheusRule.thresholds.queuedTooLongSeconds=1800",
    "monitoring.prometheusRule.thresholds.queuedTooLongFor=3m",
    "monitoring.prometheusRule.thresholds.poolAtMaximumFor=1h",
    "monitoring.prometheusRule.thresholds.podsUnschedulableFor=20m",
]


def test_thresholds_rewrite_the_for_durations_and_the_queued_age_limit(chart, tmp_path):
    (rule,) = chart.render(scenario("keda-static"), sets=ON + THRESHOLDS).all("PrometheusRule")
    rendered = {x["alert"]: x for g in rule["spec"]["groups"] for x in g["rules"]}
    shipped = {x["alert"]: x for g in shipped_rules()["groups"] for x in g["rules"]}
    want_for = {
        "AstroSentinelDown": "7m", "AstroSentinelDataStale": "7m", "AstroAgentPoolStuckAtZero": "90s",
        "AstroAgentTasksQueuedTooLong": "3m", "AstroAgentPoolAtMaximum": "1h", "AstroAgentPodsUnschedulable": "20m",
    }
    for name, x in rendered.items():
        assert x.get("for") == want_for.get(name, shipped[name].get("for")), name
        if name == "AstroAgentTasksQueuedTooLong":
            assert x["expr"] == "astro_sentinel_worker_oldest_queued_age_seconds > 1800"
            assert shipped[name]["expr"] == "astro_sentinel_worker_oldest_queued_age_seconds > 600"
        else:
            assert x["expr"] == shipped[name]["expr"], name
        assert x["annotations"] == shipped[name]["annotations"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = prometheus_server.promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


def test_thresholds_refuse_what_prometheus_would_not_parse(chart):
    base = scenario("keda-static")
    err = chart.render_error(base, sets=ON + ["monitoring.prometheusRule.thresholds.poolStuckAtZeroFor=5 minutes"])
    assert "/monitoring/prometheusRule/thresholds/poolStuckAtZeroFor" in err
    err = chart.render_error(base, sets=ON + ["monitoring.prometheusRule.thresholds.queuedTooLongSeconds=0"])
    assert "/monitoring/prometheusRule/thresholds/queuedTooLongSeconds" in err
    err = chart.render_error(base, sets=ON + ["monitoring.prometheusRule.thresholds.poolAtZeroFor=5m"])
    assert "poolAtZeroFor" in err


def test_rules_file_names_the_metrics_the_agent_and_sentinel_export():
    exprs = " ".join(r["expr"] for g in shipped_rules()["groups"] for r in g["rules"])
    names = set(re.findall(r"\b(astro_(?:agent|sentinel)_[a-z_]+)", exprs))
    assert names == {
        "astro_agent_client_queue_stats", "astro_agent_slots", "astro_agent_heartbeat_age_seconds",
        "astro_agent_tasks_finished_total", "astro_sentinel_worker_available",
        "astro_sentinel_worker_backlog", "astro_sentinel_worker_replicas",
        "astro_sentinel_worker_max_replicas", "astro_sentinel_worker_pods",
        "astro_sentinel_worker_oldest_queued_age_seconds", "astro_sentinel_pool_paused",
    }
    # The pool alerts read no agent series: those vanish when the pool is at zero.
    pool_alerts = ("AstroAgentPoolStuckAtZero", "AstroAgentTasksQueuedTooLong", "AstroAgentPoolAtMaximum",
                   "AstroAgentPodsUnschedulable")
    (sentinel_group,) = [g for g in shipped_rules()["groups"] if g["name"] == SENTINEL_GROUP]
    for r in sentinel_group["rules"]:
        if r["alert"] in pool_alerts:
            assert "astro_agent_" not in r["expr"], r["alert"]
    assert {r["alert"] for r in sentinel_group["rules"]} >= set(pool_alerts)
    # The backlog is de-duplicated across Pods the way the prometheus-adapter rule does it.
    (backlog,) = [r for g in shipped_rules()["groups"] for r in g["rules"] if r["alert"] == "AstroAgentBacklogAboveCapacity"]
    assert "max by (namespace, job, queue, state) (astro_agent_client_queue_stats" in backlog["expr"]


# ---------------------------------------------------------------------------------------------
# Dashboard ConfigMap.


def test_dashboard_configmap_for_the_grafana_sidecar(chart):
    r = chart.render(scenario("hpa"), sets=ON)
    cm = r.get("ConfigMap", "astro-dashboard", namespace=NAMESPACE)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert list(cm["data"]) == ["astro-agent-worker.json"]
    assert json.loads(cm["data"]["astro-agent-worker.json"]) == shipped_dashboard()


def test_dashboard_configmap_namespace_labels_annotations(chart, validate):
    r = chart.render(scenario("hpa"), sets=ON + [
        "monitoring.dashboard.namespace=grafana",
        "monitoring.dashboard.labels.grafana_dashboard=null",
        "monitoring.dashboard.labels.dashboards=astro",
        "monitoring.dashboard.annotations.grafana_folder=Airflow",
    ])
    cm = r.get("ConfigMap", "astro-dashboard")
    validate(cm)
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["dashboards"] == "astro"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"]["grafana_folder"] == "Airflow"


def test_schema_rejects_unknown_monitoring_keys(chart):
    err = chart.render_error(scenario("defaults"), sets=["monitoring.dashboard.label.x=y"])
    assert "monitoring" in err and "label" in err
    err = chart.render_error(scenario("defaults"), sets=["monitoring.prometheusRule.enabled=yes"])
    assert "/monitoring/prometheusRule/enabled" in err


def _targets(dashboard):
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            yield panel, t


def test_dashboard_is_for_one_worker_deployment():
    d = shipped_dashboard()
    assert d["uid"] == "astro-agent-worker"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "deployment"}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["deployment"]["query"]["query"] == 'label_values(astro_agent_build_info{namespace="$namespace"}, job)'

    seen_ids = set()
    boxes = []
    for panel in d["panels"]:
        assert panel["id"] not in seen_ids
        seen_ids.add(panel["id"])
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        for (x, y, w, h) in boxes:  # no two panels overlap
            assert g["x"] >= x + w or x >= g["x"] + g["w"] or g["y"] >= y + h or y >= g["y"] + g["h"], panel["title"]
        boxes.append((g["x"], g["y"], g["w"], g["h"]))
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids) and ref_ids, panel["title"]

    exprs = [t["expr"] for _, t in _targets(d)]
    # Every agent/Sentinel selector is scoped to the chosen Deployment.
    for expr in exprs:
        for m in re.finditer(r"\b(astro_agent_[a-z_]+)\{([^}]*)\}", expr):
            assert 'job="$deployment"' in m.group(2) and 'namespace="$namespace"' in m.group(2), expr
        for m in re.finditer(r"\b(astro_sentinel_[a-z_]+)\{([^}]*)\}", expr):
            assert 'worker="$deployment"' in m.group(2), expr
        assert not re.search(r"\bastro_(agent|sentinel)_[a-z_]+(\s|\)|\[|$)", expr), f"unscoped selector in {expr}"

    text = " ".join(exprs)
    # What the issue asks the dashboard to show.
    for needed in ("astro_agent_client_queue_stats", "astro_agent_slots{", "astro_agent_slots_in_use",
                   "kube_deployment_spec_replicas", "kube_horizontalpodautoscaler_status_desired_replicas",
                   "astro_agent_task_duration_seconds_bucket", "astro_agent_tasks_finished_total",
                   "astro_agent_heartbeat_age_seconds", "astro_agent_edge_api_request_failures_total",
                   "astro_sentinel_worker_oldest_queued_age_seconds", "astro_sentinel_worker_pods"):
        assert needed in text, needed


# ---------------------------------------------------------------------------------------------
# ServiceMonitors: one for the workers, one for the Sentinel.


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_service_monitors(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    prefix = values["resourceNamePrefix"]
    sms = {sm["metadata"]["name"]: sm for sm in r.all("ServiceMonitor")}
    want = set()
    if values["serviceMonitor"]["workers"]["enabled"]:
        want.add(f"{prefix}-workers")
    if values["serviceMonitor"]["sentinel"]["enabled"] and values["sentinel"]["enabled"]:
        want.add(f"{prefix}-sentinel")
    assert set(sms) == want
    if f"{prefix}-workers" in sms:
        sm = sms[f"{prefix}-workers"]
        assert sm["spec"]["jobLabel"] == "deploymentName"
        assert sm["spec"]["endpoints"][0]["port"] == "http" and sm["spec"]["endpoints"][0]["path"] == "/metrics"
        sel = sm["spec"]["selector"]["matchLabels"]
        selected = [s["metadata"]["name"] for s in r.all("Service") if sel.items() <= s["metadata"]["labels"].items()]
        assert sorted(selected) == sorted(w["deployment"] for w in workers)
        for k, v in values["serviceMonitor"]["labels"].items():
            assert sm["metadata"]["labels"][k] == v
    if f"{prefix}-sentinel" in sms:
        sel = sms[f"{prefix}-sentinel"]["spec"]["selector"]["matchLabels"]
        selected = [s["metadata"]["name"] for s in r.all("Service") if sel.items() <= s["metadata"]["labels"].items()]
        assert selected == [f"{prefix}-sentinel"]
