"""The astro-agent chart, rendered by a real helm and checked against the real API schemas, with
assertions on the contracts the rest of the system depends on (see the design's Chart contracts)."""

import base64
import json
import math
import os
import re
import select
import subprocess
import textwrap
import time

import pytest
import yaml

from conftest import (
    CHART,
    INVALID_SCENARIOS,
    KUBE_VERSION,
    NAMESPACE,
    VALID_SCENARIOS,
    VALUES,
    dump,
    load_values,
    scenario,
)

# The rule of the core spec, character for character.
SEED_METRICS_QUERY = (
    'sum by (job) (max by (job, queue, state) '
    '(<<.Series>>{state=~"queued|running", <<.LabelMatchers>>}))'
)
SEED_SERIES_QUERY = '{__name__="astro_agent_client_queue_stats",container!="POD",namespace!="",pod!=""}'
# Fast up, slow down: the HPA path's default behavior.
SEED_HPA_BEHAVIOR = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}, {"type": "Pods", "value": 4, "periodSeconds": 15}],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 300,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
    },
}
SENTINEL_PORT = 39092
AGENT_PORT = 39091
# The Sentinel rejects unknown keys in its config: the chart must render only these.
SENTINEL_CONFIG_KEYS = {"refreshInterval", "stalenessLimit", "source", "auth", "workers", "kubernetes", "history"}
SENTINEL_WORKER_KEYS = {"name", "queues", "syncSlots", "minReplicas", "maxReplicas"}


# ---------------------------------------------------------------------------------------------
# What a values file means, computed independently of the chart's templates.


def chart_defaults():
    return yaml.safe_load((CHART / "values.yaml").read_text())


def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        elif v is not None:
            out[k] = v
    return out


def effective(name):
    """Chart defaults + the scenario's values, and each worker merged over workerDefaults."""
    values = deep_merge(chart_defaults(), load_values(name))
    prefix = values["resourceNamePrefix"]
    workers = []
    for entry in values["workers"]:
        w = deep_merge(values["workerDefaults"], entry)
        q = w["queues"]
        w["queues"] = [s.strip() for s in (q.split(",") if isinstance(q, str) else q) if s.strip()]
        w["deployment"] = f"{prefix}-worker-{w['name']}"
        w["mode"] = "keda" if w["keda"]["enabled"] else "hpa" if w["hpa"]["enabled"] else "fixed"
        workers.append(w)
    return values, workers


def container(deploy, name):
    found = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1
    return found[0]


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


def sentinel_config(r, values):
    cm = r.get("ConfigMap", f"{values['resourceNamePrefix']}-sentinel")
    return yaml.safe_load(cm["data"]["config.yaml"])


# ---------------------------------------------------------------------------------------------
# helm lint and schema validation of every object of every scenario.


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_helm_lint_strict(chart, name):
    proc = chart.run("lint", "--strict", ".", "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                     "-f", str(scenario(name)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_every_object_matches_its_api_schema(chart, validate, name):
    r = chart.render(scenario(name))
    assert r.docs, "nothing rendered"
    seen = set()
    for doc in r.docs:
        validate(doc)
        key = (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
        assert key not in seen, f"{key} rendered twice"
        seen.add(key)


def test_validator_catches_a_misspelt_scaledobject_field(chart, validate):
    """The CRD check is not a rubber stamp: a typo under spec fails it."""
    so = chart.render(scenario("keda-static")).all("ScaledObject")[0]
    broken = yaml.safe_load(yaml.safe_dump(so))
    broken["spec"]["minReplicas"] = broken["spec"].pop("minReplicaCount")
    with pytest.raises(pytest.fail.Exception):
        validate(broken)
    broken = yaml.safe_load(yaml.safe_dump(so))
    broken["spec"]["fallback"]["behavior"] = "keepEverything"
    with pytest.raises(pytest.fail.Exception):
        validate(broken)


@pytest.mark.parametrize("name", INVALID_SCENARIOS)
def test_invalid_values_are_refused_with_a_message_naming_the_key(chart, name):
    path = VALUES / "invalid" / f"{name}.yaml"
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <message>'"
    expected = first[len("# expect: "):]
    err = chart.render_error(path)
    assert expected in err, f"expected {expected!r} in:\n{err}"


def test_bare_chart_asks_for_the_airflow_connection(chart):
    err = chart.render_error()
    assert "airflow.edgeApiUrl is required when workers are defined" in err


def test_invalid_values_via_set_flags(chart):
    base = scenario("keda-static")
    err = chart.render_error(base, sets=["sentinel.enabled=false"])
    assert "sentinel.enabled is false" in err
    err = chart.render_error(base, sets=["workers[0].syncSlots=0"])
    assert "workers[0].syncSlots is 0" in err
    err = chart.render_error(base, sets=["workers[0].hpa.enabled=true"])
    assert "workers[0].keda.enabled and workers[0].hpa.enabled are both true" in err


# ---------------------------------------------------------------------------------------------
# Workers: Deployment + Service per entry.


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_each_worker_has_its_deployment_and_metrics_service(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    worker_deploys = [d for d in r.all("Deployment") if d["spec"]["template"]["metadata"]["labels"].get("component") == "worker"]
    assert sorted(d["metadata"]["name"] for d in worker_deploys) == sorted(w["deployment"] for w in workers)
    for w in workers:
        d = r.get("Deployment", w["deployment"])
        pod_labels = d["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["app"] == "astro-agent" and pod_labels["component"] == "worker"
        selector = d["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()

        svc = r.get("Service", w["deployment"])
        assert svc["metadata"]["labels"]["deploymentName"] == d["metadata"]["name"]
        assert svc["metadata"]["labels"]["app"] == "astro-agent"
        assert svc["metadata"]["labels"]["component"] == "worker"
        # The Service selects exactly this worker's Pods ...
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        for other in worker_deploys:
            if other is not d:
                assert not svc["spec"]["selector"].items() <= other["spec"]["template"]["metadata"]["labels"].items()
        # ... on the port named http that serves /metrics.
        assert svc["spec"]["publishNotReadyAddresses"] is True  # draining Pods are still scraped
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] == "http"]
        c = container(d, "agent")
        (cport,) = [p for p in c["ports"] if p["name"] == port["targetPort"]]
        assert cport["containerPort"] == AGENT_PORT


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_worker_pod_spec(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    for w in workers:
        d = r.get("Deployment", w["deployment"])
        spec = d["spec"]["template"]["spec"]
        c = container(d, "agent")
        env = env_of(c)

        # Configuration through ASTRO_AGENT_* env, nothing on the command line.
        assert "args" not in c and "command" not in c
        assert env["ASTRO_AGENT_QUEUES"]["value"] == ",".join(w["queues"])
        assert env["ASTRO_AGENT_SYNC_SLOTS"]["value"] == str(w["syncSlots"])
        assert env["ASTRO_AGENT_WORKER_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["ASTRO_AGENT_LISTEN"]["value"] == f"0.0.0.0:{AGENT_PORT}"

        # The drain deadline ends before the kubelet's SIGKILL.
        grace = spec["terminationGracePeriodSeconds"]
        assert grace == w["terminationGracePeriodSeconds"]
        m = re.fullmatch(r"(\d+)s", env["ASTRO_AGENT_DRAIN_TIMEOUT"]["value"])
        assert m, env["ASTRO_AGENT_DRAIN_TIMEOUT"]
        drain = int(m.group(1))
        assert 0 <= drain < grace
        margin = w["drainMarginSeconds"]
        assert drain == (grace - margin if grace >= 2 * margin else grace // 2)

        # Probes.
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}

        # Non-root, read-only root filesystem, writable scratch where the agent writes.
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for path in ("/tmp", w["logFolder"]):
            assert "emptyDir" in volumes[mounts[path]], path
        assert env["ASTRO_AGENT_LOG_FOLDER"]["value"] == w["logFolder"]
        assert env["ASTRO_AGENT_LOG_FORMAT"]["value"] == w["logFormat"]
        for extra in w["extraVolumeMounts"]:
            assert mounts[extra["mountPath"]] == extra["name"]
        for extra in w["extraVolumes"]:
            assert volumes[extra["name"]] == extra

        # Image: repository + tag (default appVersion), never a vendor registry.
        chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
        tag = w["image"]["tag"] or chart_meta["appVersion"]
        assert c["image"] == f"{w['image']['repository']}:{tag}"
        assert c["imagePullPolicy"] == "IfNotPresent"

        # Scheduling knobs pass through.
        for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
            assert spec.get(key) == (w[key] or None), key
        assert spec.get("priorityClassName") == (w["priorityClassName"] or None)
        for k, v in w["podLabels"].items():
            assert d["spec"]["template"]["metadata"]["labels"][k] == v
        for k, v in w["podAnnotations"].items():
            assert d["spec"]["template"]["metadata"]["annotations"][k] == v
        for k, v in w["annotations"].items():
            assert d["metadata"]["annotations"][k] == v
        for e in w["env"]:
            assert env[e["name"]] == e


def test_default_image_and_defaults(chart):
    r = chart.render(scenario("defaults"))
    (d,) = [x for x in r.all("Deployment")]
    assert d["metadata"]["name"] == "astro-worker-default"
    c = container(d, "agent")
    assert c["image"].startswith("astro-agent:")
    assert d["spec"]["replicas"] == 1
    assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 600
    assert env_of(c)["ASTRO_AGENT_DRAIN_TIMEOUT"]["value"] == "570s"
    assert not r.all("ScaledObject") and not r.all("HorizontalPodAutoscaler") and not r.maybe("Deployment", "astro-sentinel")


def test_short_grace_period_keeps_drain_below_it(chart):
    r = chart.render(scenario("mixed"))
    env = env_of(container(r.get("Deployment", "prod-worker-pinned"), "agent"))
    assert env["ASTRO_AGENT_DRAIN_TIMEOUT"]["value"] == "20s"  # 40 s grace, 30 s margin: half of it
    for grace, expected in ((1, 0), (3, 1), (59, 29), (60, 30), (61, 31)):
        r = chart.render(scenario("defaults"), sets=[f"workerDefaults.terminationGracePeriodSeconds={grace}"])
        env = env_of(container(r.get("Deployment", "astro-worker-default"), "agent"))
        assert env["ASTRO_AGENT_DRAIN_TIMEOUT"]["value"] == f"{expected}s"


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_replicas_rendered_only_without_an_autoscaler(chart, name):
    _, workers = effective(name)
    r = chart.render(scenario(name))
    for w in workers:
        spec = r.get("Deployment", w["deployment"])["spec"]
        if w["mode"] == "fixed":
            assert spec["replicas"] == w["replicas"]
        else:
            # KEDA or the HPA owns the count; a rendered value would fight it on every sync.
            assert "replicas" not in spec, f"{w['deployment']} ({w['mode']}) renders replicas"


def test_worker_entry_false_overrides_a_true_default(chart):
    """workerDefaults.keda.enabled is true in 'mixed'; entries that say false must stay off."""
    _, workers = effective("mixed")
    modes = {w["name"]: w["mode"] for w in workers}
    assert modes == {"default": "keda", "batch": "keda", "api-calls": "hpa", "pinned": "fixed"}
    r = chart.render(scenario("mixed"))
    assert sorted(so["metadata"]["name"] for so in r.all("ScaledObject")) == ["prod-worker-batch", "prod-worker-default"]
    assert [h["metadata"]["name"] for h in r.all("HorizontalPodAutoscaler")] == ["prod-worker-api-calls"]
    # minReplicaCount: 0 from workerDefaults survives, 1 from the entry wins.
    assert r.get("ScaledObject", "prod-worker-batch")["spec"]["minReplicaCount"] == 0
    assert r.get("ScaledObject", "prod-worker-default")["spec"]["minReplicaCount"] == 1
    assert r.get("ScaledObject", "prod-worker-default")["spec"]["pollingInterval"] == 10


def test_logs_are_json_by_default_and_text_per_worker_or_for_the_sentinel(chart, tmp_path):
    r = chart.render(scenario("keda-static"))
    worker = env_of(container(r.get("Deployment", "astro-worker-default-worker"), "agent"))
    sentinel = env_of(container(r.get("Deployment", "astro-sentinel"), "sentinel"))
    assert worker["ASTRO_AGENT_LOG_FORMAT"] == {"name": "ASTRO_AGENT_LOG_FORMAT", "value": "json"}
    assert sentinel["ASTRO_SENTINEL_LOG_FORMAT"] == {"name": "ASTRO_SENTINEL_LOG_FORMAT", "value": "json"}

    # One worker of two reads its logs as text; the other keeps workerDefaults'.
    values = load_values("keda-static")
    values["workers"] = [dict(values["workers"][0], name="people", logFormat="text"),
                         dict(values["workers"][0], name="pipeline")]
    values["sentinel"]["logFormat"] = "text"
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    r = chart.render(tmp_path / "values.yaml")
    formats = {d["metadata"]["name"]: env_of(container(d, "agent"))["ASTRO_AGENT_LOG_FORMAT"]["value"]
               for d in r.all("Deployment") if d["metadata"]["name"] != "astro-sentinel"}
    assert formats == {"astro-worker-people": "text", "astro-worker-pipeline": "json"}
    sentinel = env_of(container(r.get("Deployment", "astro-sentinel"), "sentinel"))
    assert sentinel["ASTRO_SENTINEL_LOG_FORMAT"]["value"] == "text"

    # Only what the binaries accept (`--log-format text|json`).
    for key in ("workerDefaults.logFormat", "workers[0].logFormat", "sentinel.logFormat"):
        err = chart.render_error(scenario("keda-static"), sets=[f"{key}=xml"])
        assert "logFormat" in err and "text" in err and "json" in err, err


# ---------------------------------------------------------------------------------------------
# KEDA path.


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_scaledobject_reads_the_workers_backlog_from_the_sentinel(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    keda_workers = [w for w in workers if w["mode"] == "keda"]
    assert sorted(so["metadata"]["name"] for so in r.all("ScaledObject")) == sorted(w["deployment"] for w in keda_workers)
    if not keda_workers:
        return
    prefix = values["resourceNamePrefix"]
    sentinel_svc = r.get("Service", f"{prefix}-sentinel")
    (svc_port,) = [p for p in sentinel_svc["spec"]["ports"] if p["name"] == "http"]
    sentinel = r.get("Deployment", f"{prefix}-sentinel")
    sentinel_pod_labels = sentinel["spec"]["template"]["metadata"]["labels"]
    assert sentinel_svc["spec"]["selector"].items() <= sentinel_pod_labels.items()
    (cport,) = [p for p in container(sentinel, "sentinel")["ports"] if p["name"] == svc_port["targetPort"]]
    assert cport["containerPort"] == SENTINEL_PORT == svc_port["port"]

    for w in keda_workers:
        so = r.get("ScaledObject", w["deployment"])
        spec = so["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": w["deployment"]}
        assert spec["minReplicaCount"] == w["keda"]["minReplicaCount"]
        assert spec["maxReplicaCount"] == w["keda"]["maxReplicaCount"]
        assert spec["pollingInterval"] == w["keda"]["pollingInterval"]
        assert spec["cooldownPeriod"] == w["keda"]["cooldownPeriod"]

        trigger = spec["triggers"][0]
        assert trigger["type"] == "metrics-api"
        assert trigger.get("metricType", "AverageValue") == "AverageValue"
        md = trigger["metadata"]
        assert md["targetValue"] == str(w["syncSlots"])  # the user never sets it
        assert md["valueLocation"] == "backlog" and md["format"] == "json"
        assert md["authModes"] == "bearer"
        assert md["activationTargetValue"] == str(w["keda"]["activationTargetValue"])
        url = f"http://{sentinel_svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{svc_port['port']}/v1/workers/{w['deployment']}"
        assert md["url"] == url
        # The Sentinel knows the worker by the same name the URL asks for.
        assert w["deployment"] in [x["name"] for x in sentinel_config(r, values)["workers"]]

        # Extra triggers appended as given.
        assert spec["triggers"][1:] == w["keda"]["extraTriggers"]

        # Fallback keeps the pool; at least one Pod, so a worker at zero is not left idle.
        fb = spec["fallback"]
        assert fb["behavior"] == w["keda"]["fallback"]["behavior"]
        explicit = w["keda"]["fallback"]["replicas"]
        assert fb["replicas"] == (explicit if explicit is not None else max(w["keda"]["minReplicaCount"], 1))
        assert fb["replicas"] >= 1
        if w["keda"]["behavior"]:
            assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == w["keda"]["behavior"]

        # The authentication object it names exists and carries a bearer token.
        ref = trigger["authenticationRef"]
        auth = r.get(ref["kind"], ref["name"])
        if ref["kind"] == "TriggerAuthentication":
            assert auth["metadata"]["namespace"] == NAMESPACE
            (target,) = auth["spec"]["secretTargetRef"]
            assert target["parameter"] == "bearerToken"
        else:
            (bound,) = auth["spec"]["boundServiceAccountToken"]
            assert bound["parameter"] == "bearerToken"


def test_queued_age_trigger_is_off_by_default(chart):
    assert chart_defaults()["workerDefaults"]["keda"]["queuedAge"]["enabled"] is False
    for name in VALID_SCENARIOS:
        for so in chart.render(scenario(name)).all("ScaledObject"):
            assert all(t["metadata"].get("valueLocation") != "oldestQueuedAgeSeconds" for t in so["spec"]["triggers"])


@pytest.mark.parametrize("name", ["keda-static", "keda-bound"])
def test_queued_age_trigger_reads_the_oldest_wait_against_its_target(chart, validate, name):
    """Seed 002's latency target: a second metrics-api trigger on the same Sentinel answer,
    metricType Value so that the pool grows by age / target; the backlog trigger is unchanged."""
    plain = chart.render(scenario(name)).all("ScaledObject")[0]
    sets = ["workers[0].keda.queuedAge.enabled=true", "workers[0].keda.queuedAge.targetSeconds=90"]
    so = chart.render(scenario(name), sets=sets).all("ScaledObject")[0]
    validate(so)
    backlog, age = so["spec"]["triggers"]
    assert backlog == plain["spec"]["triggers"][0]
    assert age["type"] == "metrics-api" and age["name"] == "oldest-queued-age"
    assert age["metricType"] == "Value"
    md = age["metadata"]
    assert md["valueLocation"] == "oldestQueuedAgeSeconds" and md["format"] == "json"
    assert md["targetValue"] == "90"
    assert md["url"] == backlog["metadata"]["url"]
    assert md["authModes"] == "bearer"
    assert age["authenticationRef"] == backlog["authenticationRef"]


def test_queued_age_target_must_be_positive(chart):
    err = chart.render_error(
        scenario("keda-static"),
        sets=["workers[0].keda.queuedAge.enabled=true", "workers[0].keda.queuedAge.targetSeconds=0"],
    )
    assert "targetSeconds" in err


def test_keda_defaults_from_the_seed(chart):
    so = chart.render(scenario("keda-static")).get("ScaledObject", "astro-worker-default-worker")
    spec = so["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (0, 10, 300)
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": 1, "behavior": "currentReplicasIfHigher"}
    md = spec["triggers"][0]["metadata"]
    assert md["targetValue"] == "20" and md["activationTargetValue"] == "0"


def test_static_token_is_shared_by_keda_and_the_sentinel(chart):
    values, _ = effective("keda-static")
    r = chart.render(scenario("keda-static"))
    ta = r.get("TriggerAuthentication", "astro-keda-sentinel")
    (target,) = ta["spec"]["secretTargetRef"]
    secret = r.get("Secret", target["name"])
    token = base64.b64decode(secret["data"][target["key"]]).decode()
    assert len(token) >= 32

    sentinel = r.get("Deployment", "astro-sentinel")
    spec = sentinel["spec"]["template"]["spec"]
    config = sentinel_config(r, values)
    assert config["auth"] == {"disabled": False, "staticTokensFile": "/etc/astro-sentinel/tokens/tokens"}
    (mount,) = [m for m in container(sentinel, "sentinel")["volumeMounts"] if m["mountPath"] == "/etc/astro-sentinel/tokens"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert vol["secret"]["secretName"] == target["name"]
    assert vol["secret"]["items"] == [{"key": target["key"], "path": "tokens"}]
    assert "subPath" not in mount  # a rotated token must reach the running Sentinel
    # No TokenReview rights without the bound-token mode: the API token serves only the
    # namespaced Role that reads the workers (and sets their pod-deletion cost).
    assert spec["automountServiceAccountToken"] is True
    assert not r.all("ClusterRole") and not r.all("ClusterRoleBinding") and not r.all("ClusterTriggerAuthentication")
    assert config["kubernetes"] == {"namespace": NAMESPACE, "idleFirstScaleIn": True}
    role = r.get("Role", "astro-sentinel")
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    ]
    binding = r.get("RoleBinding", "astro-sentinel")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "astro-sentinel", "namespace": NAMESPACE}]


def test_sentinel_without_kubernetes_access_has_no_api_token(chart):
    values, _ = effective("keda-static")
    r = chart.render(scenario("keda-static"), sets=("sentinel.kubernetes.enabled=false",))
    assert r.get("Deployment", "astro-sentinel")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert not r.all("Role") and not r.all("RoleBinding") and not r.all("ClusterRole")
    assert "kubernetes" not in sentinel_config(r, values)


def test_idle_first_scale_in_off_drops_the_patch_right(chart):
    values, _ = effective("keda-static")
    r = chart.render(scenario("keda-static"), sets=("sentinel.kubernetes.idleFirstScaleIn=false",))
    assert r.get("Role", "astro-sentinel")["rules"][1]["verbs"] == ["get", "list", "watch"]
    assert sentinel_config(r, values)["kubernetes"]["idleFirstScaleIn"] is False


def test_static_token_from_an_existing_secret(chart):
    r = chart.render(scenario("scale-to-zero"))
    (target,) = r.get("TriggerAuthentication", "astro-keda-sentinel")["spec"]["secretTargetRef"]
    assert (target["name"], target["key"]) == ("keda-sentinel-token", "bearer")
    assert not r.maybe("Secret", "astro-keda-sentinel-token")
    (vol,) = [v for v in r.get("Deployment", "astro-sentinel")["spec"]["template"]["spec"]["volumes"] if v["name"] == "tokens"]
    assert vol["secret"] == {"secretName": "keda-sentinel-token", "items": [{"key": "bearer", "path": "tokens"}]}


def test_bound_token_identity(chart):
    values, _ = effective("keda-bound")
    r = chart.render(scenario("keda-bound"))
    cta_name = r.get("ScaledObject", "astro-worker-etl")["spec"]["triggers"][0]["authenticationRef"]["name"]
    cta = r.get("ClusterTriggerAuthentication", cta_name)
    assert "namespace" not in cta["metadata"]
    (bound,) = cta["spec"]["boundServiceAccountToken"]
    sa_name = bound["serviceAccountName"]

    # KEDA mints tokens in the namespace where it resolves cluster objects.
    obj_ns = values["keda"]["clusterObjectNamespace"]
    sa = r.get("ServiceAccount", sa_name, namespace=obj_ns)
    assert sa["automountServiceAccountToken"] is False
    # The account has no permissions: nothing binds it.
    for b in r.all("RoleBinding") + r.all("ClusterRoleBinding"):
        assert all(s["name"] != sa_name for s in b["subjects"]), b["metadata"]["name"]

    # Only KEDA's operator may create tokens, and only for that one account.
    (binding,) = [b for b in r.all("RoleBinding") if b["metadata"]["namespace"] == obj_ns]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": values["keda"]["operatorServiceAccountName"],
                                    "namespace": values["keda"]["namespace"]}]
    role = r.get("Role", binding["roleRef"]["name"], namespace=obj_ns)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["serviceaccounts/token"],
                              "resourceNames": [sa_name], "verbs": ["create"]}]

    # The Sentinel's allow-list names exactly that account, and it may send TokenReviews.
    config = sentinel_config(r, values)
    assert config["auth"]["tokenReview"]["allowedUsernames"] == [f"system:serviceaccount:{obj_ns}:{sa_name}"]
    assert "staticTokensFile" not in config["auth"] and config["auth"]["disabled"] is False
    sentinel = r.get("Deployment", "astro-sentinel")
    pod = sentinel["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    (crb,) = r.all("ClusterRoleBinding")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}]
    cr = r.get("ClusterRole", crb["roleRef"]["name"])
    assert cr["rules"] == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]
    assert not r.all("TriggerAuthentication") and not r.maybe("Secret", "astro-keda-sentinel-token")


def test_bound_token_audience_reaches_the_sentinel_and_the_keda_setting(chart):
    """KEDA >= 2.21 mints a bound token only for an audience mapped to the account in
    KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES: NOTES prints that entry for exactly the account the
    ClusterTriggerAuthentication names, and the Sentinel's TokenReview asks for that audience."""
    values, _ = effective("keda-bound")
    audience = values["keda"]["auth"]["boundServiceAccountToken"]["audience"]
    assert audience, "the default must work with KEDA's default token mode"
    r = chart.render(scenario("keda-bound"))
    (cta,) = r.all("ClusterTriggerAuthentication")
    sa_name = cta["spec"]["boundServiceAccountToken"][0]["serviceAccountName"]
    obj_ns = values["keda"]["clusterObjectNamespace"]
    assert sentinel_config(r, values)["auth"]["tokenReview"]["audiences"] == [audience]

    notes = chart.notes(scenario("keda-bound"))
    block = notes[notes.index("  env:\n"):]
    env = yaml.safe_load(textwrap.dedent(block[: block.index("\n\n") if "\n\n" in block else len(block)]))
    (var,) = env["env"]
    assert var["name"] == "KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES"
    assert yaml.safe_load(var["value"]) == [{"namespace": obj_ns, "serviceAccountName": sa_name, "audience": audience}]
    assert f"--audience={audience}" in notes

    # Empty: the API server's own audience (older KEDA, or KEDA's legacy token mode).
    r = chart.render(scenario("keda-bound"), sets=["keda.auth.boundServiceAccountToken.audience="])
    assert "audiences" not in sentinel_config(r, values)["auth"]["tokenReview"]
    notes = chart.notes(scenario("keda-bound"), sets=["keda.auth.boundServiceAccountToken.audience="])
    assert "KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES" not in notes and "--audience" not in notes
    assert "--service-account-token-mode=legacy" in notes


def test_bound_token_defaults_to_kedas_own_namespace(chart):
    r = chart.render(scenario("keda-static"), sets=["keda.auth.mode=boundServiceAccountToken"])
    (sa,) = [s for s in r.all("ServiceAccount") if s["metadata"]["namespace"] == "keda"]
    config = yaml.safe_load(r.get("ConfigMap", "astro-sentinel")["data"]["config.yaml"])
    assert config["auth"]["tokenReview"]["allowedUsernames"] == [f"system:serviceaccount:keda:{sa['metadata']['name']}"]
    (binding,) = [b for b in r.all("RoleBinding") if b["metadata"]["namespace"] == "keda"]
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": "keda-operator", "namespace": "keda"}


# ---------------------------------------------------------------------------------------------
# Sentinel.


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_sentinel_worker_list_matches_the_keda_workers(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    if not values["sentinel"]["enabled"]:
        assert not r.maybe("Deployment", f"{values['resourceNamePrefix']}-sentinel")
        assert not r.maybe("ConfigMap", f"{values['resourceNamePrefix']}-sentinel")
        return
    config = sentinel_config(r, values)
    assert set(config) <= SENTINEL_CONFIG_KEYS
    expected = [
        {"name": w["deployment"], "queues": w["queues"], "syncSlots": w["syncSlots"],
         "minReplicas": w["keda"]["minReplicaCount"], "maxReplicas": w["keda"]["maxReplicaCount"]}
        for w in workers if w["mode"] == "keda"
    ]
    assert config["workers"] == expected
    for entry in config["workers"]:
        assert set(entry) == SENTINEL_WORKER_KEYS
    assert config["refreshInterval"] == values["sentinel"]["refreshInterval"]
    assert config["stalenessLimit"] == values["sentinel"]["stalenessLimit"]

    sentinel = r.get("Deployment", f"{values['resourceNamePrefix']}-sentinel")
    c = container(sentinel, "sentinel")
    (arg,) = c["args"]
    config_path = arg.split("=", 1)[1]
    assert arg.startswith("--config=")
    (mount,) = [m for m in c["volumeMounts"] if config_path.startswith(m["mountPath"] + "/")]
    (vol,) = [v for v in sentinel["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert vol["configMap"]["name"] == f"{values['resourceNamePrefix']}-sentinel"
    assert config_path.rsplit("/", 1)[1] == "config.yaml"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True

    env = env_of(c)
    source = values["sentinel"]["source"]["type"]
    assert config["source"]["type"] == source
    if source == "airflow-api":
        assert config["source"] == {"type": "airflow-api", "airflowApi": {"url": values["airflow"]["restApi"]["url"]}}
        assert ("ASTRO_SENTINEL_AIRFLOW_TOKEN_FILE" in env) != ("ASTRO_SENTINEL_AIRFLOW_USERNAME" in env)
        assert ("ASTRO_SENTINEL_AIRFLOW_USERNAME" in env) == ("ASTRO_SENTINEL_AIRFLOW_PASSWORD_FILE" in env)
        files = [v for k, v in env.items() if k.endswith("_FILE") and k.startswith("ASTRO_SENTINEL_AIRFLOW_")]
    else:
        assert config["source"]["postgres"]["sslMode"] == values["sentinel"]["source"]["postgres"]["sslMode"]
        files = [env["ASTRO_SENTINEL_POSTGRES_URL_FILE"]]
    # Credentials are files of the projected credentials volume, never environment variables.
    assert files
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "airflow-credentials"]
    (vol,) = [v for v in sentinel["spec"]["template"]["spec"]["volumes"] if v["name"] == "airflow-credentials"]
    paths = {item["path"] for src in vol["projected"]["sources"] for item in src["secret"]["items"]}
    for f in files:
        assert f["value"].startswith(mount["mountPath"] + "/") and f["value"].rsplit("/", 1)[1] in paths, f


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_airflow_ca_reaches_the_agents_and_the_sentinel_as_a_file(chart, name):
    values, _ = effective(name)
    ca = values["airflow"]["caCertificate"]
    r = chart.render(scenario(name))
    prefix = values["resourceNamePrefix"]
    pods = [(d, "agent", "ASTRO_AGENT_CA_FILE") for d in r.all("Deployment")
            if d["metadata"]["name"].startswith(f"{prefix}-worker-")]
    if values["sentinel"]["enabled"] and values["sentinel"]["source"]["type"] == "airflow-api":
        pods.append((r.get("Deployment", f"{prefix}-sentinel"), "sentinel", "ASTRO_SENTINEL_CA_FILE"))
    assert pods
    for deploy, container_name, var in pods:
        c = container(deploy, container_name)
        env = env_of(c)
        volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
        if not ca["configMapName"]:
            assert var not in env and "airflow-ca" not in volumes
            continue
        folder, file_name = env[var]["value"].rsplit("/", 1)
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == folder]
        assert mount["readOnly"] is True
        volume = volumes[mount["name"]]
        assert volume["configMap"]["name"] == ca["configMapName"]
        assert volume["configMap"]["items"] == [{"key": ca["key"], "path": file_name}]


@pytest.mark.parametrize("name", [n for n in VALID_SCENARIOS if load_values(n).get("sentinel", {}).get("enabled")])
def test_sentinel_history_file_lives_on_its_volume(chart, name):
    values, _ = effective(name)
    r = chart.render(scenario(name))
    history = values["sentinel"]["history"]
    config = sentinel_config(r, values)
    sentinel = r.get("Deployment", f"{values['resourceNamePrefix']}-sentinel")
    mounts = {m["name"]: m for m in container(sentinel, "sentinel")["volumeMounts"]}
    volumes = {v["name"]: v for v in sentinel["spec"]["template"]["spec"]["volumes"]}
    if not history["enabled"]:
        assert "history" not in config, "memory only"
        assert "history" not in mounts and "history" not in volumes
        return
    folder, file_name = config["history"]["path"].rsplit("/", 1)
    assert file_name == "history.bin"
    assert mounts["history"]["mountPath"] == folder
    assert not mounts["history"].get("readOnly")
    if history["existingClaim"]:
        assert volumes["history"]["persistentVolumeClaim"] == {"claimName": history["existingClaim"]}
    else:
        assert volumes["history"]["emptyDir"] == {}


def test_sentinel_history_default_is_an_empty_dir_and_a_claim_needs_one_replica(chart):
    base = scenario("keda-static")
    r = chart.render(base, sets=["sentinel.history.enabled=true", "sentinel.replicaCount=2"])
    pod = r.get("Deployment", "astro-sentinel")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "history"]
    assert volume == {"name": "history", "emptyDir": {}}, "one per replica"
    err = chart.render_error(base, sets=["sentinel.history.enabled=true", "sentinel.replicaCount=2",
                                         "sentinel.history.existingClaim=history"])
    assert "sentinel.history.existingClaim" in err and "replicaCount" in err, err


@pytest.mark.parametrize("name", [n for n in VALID_SCENARIOS if load_values(n).get("sentinel", {}).get("enabled")])
def test_sentinel_network_policy_admits_keda_and_scrapers_only(chart, name):
    values, _ = effective(name)
    r = chart.render(scenario(name))
    prefix = values["resourceNamePrefix"]
    np = r.get("NetworkPolicy", f"{prefix}-sentinel")
    pod_labels = r.get("Deployment", f"{prefix}-sentinel")["spec"]["template"]["metadata"]["labels"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert np["spec"]["policyTypes"] == ["Ingress"]
    rules = np["spec"]["ingress"]
    assert rules[0]["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": values["keda"]["namespace"]}}}]
    assert [rule["from"] for rule in rules[1:]] == ([values["sentinel"]["networkPolicy"]["metricsFrom"]]
                                                   if values["sentinel"]["networkPolicy"]["metricsFrom"] else [])
    for rule in rules:
        assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]


# ---------------------------------------------------------------------------------------------
# HPA path and prometheus-adapter.


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_hpa_scales_on_the_adapter_metric_with_average_value(chart, name):
    _, workers = effective(name)
    r = chart.render(scenario(name))
    hpa_workers = [w for w in workers if w["mode"] == "hpa"]
    assert sorted(h["metadata"]["name"] for h in r.all("HorizontalPodAutoscaler")) == sorted(w["deployment"] for w in hpa_workers)
    for w in hpa_workers:
        h = r.get("HorizontalPodAutoscaler", w["deployment"])
        assert h["apiVersion"] == "autoscaling/v2"
        spec = h["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": w["deployment"]}
        assert spec["minReplicas"] == w["hpa"]["minReplicaCount"] >= 1
        assert spec["maxReplicas"] == w["hpa"]["maxReplicaCount"]
        metric = spec["metrics"][0]
        assert metric["type"] == "Object"
        assert metric["object"]["describedObject"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": w["deployment"]}
        assert metric["object"]["metric"] == {"name": "astro_agent_client_queued_or_running_tasks"}
        target = w["hpa"]["metric"]["target"]["averageValue"] or w["syncSlots"]
        assert metric["object"]["target"] == {"type": "AverageValue", "averageValue": str(target)}
        assert spec["metrics"][1:] == w["hpa"]["extraMetrics"]
        assert spec["behavior"] == deep_merge(SEED_HPA_BEHAVIOR, w["hpa"]["behavior"])
        # The agent must export the queue stats the metric is built from.
        env = env_of(container(r.get("Deployment", w["deployment"]), "agent"))
        assert env["ASTRO_AGENT_REST_API_URL"]["value"]


def test_hpa_target_defaults_to_sync_slots(chart):
    r = chart.render(scenario("mixed"))
    h = r.get("HorizontalPodAutoscaler", "prod-worker-api-calls")
    assert h["spec"]["metrics"][0]["object"]["target"]["averageValue"] == "10"
    assert h["spec"]["behavior"] == SEED_HPA_BEHAVIOR


def seconds_to_scale_up(scale_up: dict, start: int, target: int, sync_period: int = 15) -> int:
    """When an HPA whose recommendation jumps from `start` to `target` replicas reaches it, with
    the HPA controller's scale-up limit (pkg/controller/podautoscaler, calculateScaleUpLimitWithScalingRules):
    each policy allows, from the replicas at the start of its period (the current count minus what
    was added within the last periodSeconds), +value Pods or ceil(replicas x (1 + value/100)); the
    selectPolicy picks the largest (Max) or smallest (Min). A recommendation is acted on at each
    sync; a stabilization window on scale-up only delays it further, so it must be 0 here."""
    assert scale_up.get("stabilizationWindowSeconds", 0) == 0
    pick = min if scale_up.get("selectPolicy", "Max") == "Min" else max
    replicas, added, now = start, [], 0  # added: (time, pods)
    while replicas < target:
        assert now <= 3600, "no scale-up within an hour"
        limits = []
        for p in scale_up["policies"]:
            in_period = sum(n for t, n in added if t > now - p["periodSeconds"])
            period_start = replicas - in_period
            if p["type"] == "Pods":
                limits.append(period_start + p["value"])
            else:
                limits.append(math.ceil(period_start * (1 + p["value"] / 100)))
        new = min(target, max(replicas, pick(limits)))
        if new > replicas:
            added.append((now, new - replicas))
            replicas = new
            if replicas == target:
                return now
        now += sync_period
    return now


def test_hpa_default_behavior_scales_up_fast_and_down_slowly(chart):
    """1 -> 10 within a minute (the previous default, one Pod per 60 s, took 8 minutes), and
    scale-in only after 300 s without a higher recommendation, then 2 Pods a minute."""
    r = chart.render(scenario("hpa"))
    (h, *_) = r.all("HorizontalPodAutoscaler")
    behavior = h["spec"]["behavior"]
    assert behavior == SEED_HPA_BEHAVIOR
    assert seconds_to_scale_up(behavior["scaleUp"], 1, 10) < 60
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    # The check itself tells a slow policy from a fast one.
    one_a_minute = {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}
    assert seconds_to_scale_up(one_a_minute, 1, 10) == 8 * 60  # nine one-Pod steps, a minute apart


def test_hpa_behavior_override_replaces_the_default_policies(chart):
    slow = [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    r = chart.render(scenario("hpa"), sets=[
        "workerDefaults.hpa.behavior.scaleUp.policies[0].type=Pods",
        "workerDefaults.hpa.behavior.scaleUp.policies[0].value=1",
        "workerDefaults.hpa.behavior.scaleUp.policies[0].periodSeconds=60",
        "workerDefaults.hpa.behavior.scaleDown.stabilizationWindowSeconds=30",
    ])
    for h in r.all("HorizontalPodAutoscaler"):
        behavior = h["spec"]["behavior"]
        assert behavior["scaleUp"]["policies"] == slow  # the list is replaced, not appended to
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 30
        # What the user did not set keeps its default.
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
        assert behavior["scaleDown"]["policies"] == SEED_HPA_BEHAVIOR["scaleDown"]["policies"]


def _check_seed_rule(rules):
    (rule,) = rules
    assert rule["metricsQuery"] == SEED_METRICS_QUERY
    assert rule["seriesQuery"] == SEED_SERIES_QUERY
    assert rule["name"] == {"matches": ".*astro_agent_client_queue_stats.*", "as": "astro_agent_client_queued_or_running_tasks"}
    assert rule["resources"]["overrides"]["job"]["resource"] == "deployment"
    assert rule["resources"]["overrides"]["namespace"]["resource"] == "namespace"


def test_shipped_adapter_values_carry_the_seed_rule():
    shipped = yaml.safe_load((CHART / "prometheus-adapter-values.yaml").read_text())
    _check_seed_rule(shipped["rules"]["custom"])


@pytest.mark.parametrize("name", ["hpa", "mixed"])
def test_rendered_adapter_config_carries_the_seed_rule(chart, name):
    values, _ = effective(name)
    r = chart.render(scenario(name))
    cm = r.get("ConfigMap", f"{values['resourceNamePrefix']}-prometheus-adapter-rules")
    assert cm["metadata"]["namespace"] == (values["prometheusAdapter"]["rules"]["namespace"] or NAMESPACE)
    _check_seed_rule(yaml.safe_load(cm["data"]["config.yaml"])["rules"])


def test_adapter_query_aggregates_like_the_seed():
    """What the query computes over per-pod series: duplicates of a queue-wide count collapse
    (max), queued + running add up per Deployment (sum); a rule that summed pods would not."""
    series = [  # (job, pod, queue, state, value): every pod reports the same queue-wide counts
        ("astro-worker-a", p, q, s, v)
        for p in ("pod-1", "pod-2", "pod-3")
        for q, s, v in (("default", "queued", 7), ("default", "running", 20), ("default", "success", 99),
                        ("etl", "queued", 3), ("etl", "running", 0))
    ]
    dedup = {}
    for job, _, q, s, v in series:
        if re.fullmatch("queued|running", s):
            dedup[(job, q, s)] = max(dedup.get((job, q, s), v), v)
    depth = sum(dedup.values())
    assert depth == 30
    assert math.ceil(depth / 20) == 2  # with averageValue = syncSlots = 20: two Pods


# ---------------------------------------------------------------------------------------------
# Monitoring.


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


# ---------------------------------------------------------------------------------------------
# Secrets: from existing Secrets or values turned into a Secret; never in ConfigMaps or args.

SECRET_ENV = {
    "ASTRO_AGENT_API_URL": ("edgeApiUrl",),
    "ASTRO_AGENT_EXECUTION_API_URL": ("executionApiUrl",),
    "ASTRO_AGENT_REST_API_USERNAME": ("restApi", "username"),
}
# Credentials reach the agent as files (a variable would be readable by its tasks).
SECRET_FILES = {
    "ASTRO_AGENT_JWT_SECRET_FILE": ("jwtSecret",),
    "ASTRO_AGENT_REST_API_TOKEN_FILE": ("restApi", "token"),
    "ASTRO_AGENT_REST_API_PASSWORD_FILE": ("restApi", "password"),
}


def _setting(values, path):
    node = values["airflow"]
    for p in path:
        node = node[p]
    return node


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_secret_settings_reach_the_agent_through_secret_refs(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    for w in workers:
        env = env_of(container(r.get("Deployment", w["deployment"]), "agent"))
        for var, path in SECRET_ENV.items():
            setting = _setting(values, path)
            if path[0] == "restApi" and not values["airflow"]["restApi"]["url"]:
                assert var not in env
                continue
            if setting["existingSecret"]["name"]:
                assert env[var]["valueFrom"]["secretKeyRef"] == setting["existingSecret"]
            elif setting["value"]:
                ref = env[var]["valueFrom"]["secretKeyRef"]
                secret = r.get("Secret", ref["name"])
                assert base64.b64decode(secret["data"][ref["key"]]).decode() == setting["value"]
            else:
                assert var not in env


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_credentials_reach_the_agent_as_files_never_as_variables(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    for w in workers:
        deploy = r.get("Deployment", w["deployment"])
        c = container(deploy, "agent")
        env = env_of(c)
        for var in SECRET_FILES:
            assert var.removesuffix("_FILE") not in env, f"{var} as a variable"
        given = {var: _setting(values, path) for var, path in SECRET_FILES.items()
                 if (path[0] != "restApi" or values["airflow"]["restApi"]["url"])
                 and (_setting(values, path)["value"] or _setting(values, path)["existingSecret"]["name"])}
        if not given:
            assert not any(v["name"] == "airflow-credentials" for v in deploy["spec"]["template"]["spec"]["volumes"])
            continue
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "airflow-credentials"]
        assert mount["readOnly"] is True
        (vol,) = [v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "airflow-credentials"]
        by_path = {item["path"]: (src["secret"]["name"], item["key"])
                   for src in vol["projected"]["sources"] for item in src["secret"]["items"]}
        for var, setting in given.items():
            directory, file = env[var]["value"].rsplit("/", 1)
            assert directory == mount["mountPath"]
            secret_name, key = by_path[file]
            if setting["existingSecret"]["name"]:
                assert (secret_name, key) == (setting["existingSecret"]["name"], setting["existingSecret"]["key"])
            else:
                secret = r.get("Secret", secret_name)
                assert base64.b64decode(secret["data"][key]).decode() == setting["value"]
        assert set(by_path) == {env[var]["value"].rsplit("/", 1)[1] for var in given}


def test_tasks_inherit_the_workers_own_variables_and_the_listed_ones(chart):
    r = chart.render(scenario("hpa"), sets=[
        "workerDefaults.env[0].name=TEAM_BUCKET", "workerDefaults.env[0].value=b",
        "workerDefaults.env[1].name=ASTRO_AGENT_HEARTBEAT_INTERVAL", "workerDefaults.env[1].value=10s",
        "workerDefaults.taskEnvAllow[0]=AWS_*",
    ])
    for deploy in r.all("Deployment"):
        if deploy["spec"]["template"]["metadata"]["labels"].get("component") != "worker":
            continue
        env = env_of(container(deploy, "agent"))
        assert env["ASTRO_AGENT_TASK_ENV_ALLOW"]["value"] == "AWS_*,TEAM_BUCKET"
    r = chart.render(scenario("hpa"))
    for deploy in r.all("Deployment"):
        if deploy["spec"]["template"]["metadata"]["labels"].get("component") == "worker":
            assert "ASTRO_AGENT_TASK_ENV_ALLOW" not in env_of(container(deploy, "agent"))


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_no_secret_value_outside_secrets(chart, name):
    values, _ = effective(name)
    secrets = [s["value"] for s in (_setting(values, p) for p in [*SECRET_ENV.values(), *SECRET_FILES.values()]) if s["value"]
               and not s["value"].startswith("http")]
    pg = values["sentinel"]["source"]["postgres"]["url"]["value"]
    if pg:
        secrets.append(pg)
    assert secrets or name == "keda-bound"
    r = chart.render(scenario(name))
    for doc in r.docs:
        if doc["kind"] == "Secret":
            continue
        text = dump(doc)
        for s in secrets:
            assert s not in text, f"{doc['kind']}/{doc['metadata']['name']} contains a secret value"


# ---------------------------------------------------------------------------------------------
# NOTES, README, schema.


def test_notes_tell_how_to_check_the_scaling_objects(chart):
    notes = chart.notes(scenario("keda-bound"))
    assert f"kubectl get scaledobject -n {NAMESPACE}" in notes
    assert "kubectl describe scaledobject" in notes and "astro-worker-etl" in notes
    assert "kubectl create token" in notes and "--as=system:serviceaccount:keda-system:keda-operator-sa" in notes
    notes = chart.notes(scenario("hpa"))
    assert f"kubectl get hpa -n {NAMESPACE}" in notes
    assert f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/deployments.apps/astro-worker-default-worker/astro_agent_client_queued_or_running_tasks" in notes
    notes = chart.notes(scenario("keda-static"))
    assert "astro-keda-sentinel-token" in notes and "/v1/workers" in notes
    assert "WARNING" not in notes
    notes = chart.notes(scenario("keda-static"), sets=["serviceMonitor.sentinel.enabled=true"])
    assert "WARNING: serviceMonitor.sentinel is on but sentinel.networkPolicy.metricsFrom is empty" in notes


def _leaf_paths(node, prefix=""):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaf_paths(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix


def _documented_keys():
    """The keys of values.yaml's `## @param` lines; a map documented as one key covers its children."""
    text = (CHART / "values.yaml").read_text()
    return set(re.findall(r"^\s*## @param (\S+)", text, re.M))


def _covered(leaf, params):
    return any(leaf == p or leaf.startswith(p + ".") for p in params)


def _path_exists(values, path):
    node = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_values_yaml_has_a_param_comment_per_value():
    params = _documented_keys()
    defaults = chart_defaults()
    uncovered = [leaf for leaf in _leaf_paths(defaults) if not _covered(leaf, params)]
    assert not uncovered, f"values without a ## @param line: {uncovered}"
    stray = [p for p in params if not _path_exists(defaults, p)]
    assert not stray, f"## @param lines naming no value: {stray}"


def test_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    missing = [p for p in sorted(_documented_keys()) if f"`{p}`" not in readme]
    assert not missing, f"values not documented in charts/astro-agent/README.md: {missing}"


def test_schema_rejects_wrong_types(chart):
    base = scenario("defaults")
    err = chart.render_error(base, sets=["workers[0].syncSlots=many"])
    assert "/workers/0/syncSlots" in err
    err = chart.render_error(base, sets=["workerDefaults.keda.fallback.behavior=sometimes"])
    assert "/workerDefaults/keda/fallback/behavior" in err
    err = chart.render_error(base, sets=["sentinel.refreshInterval=soon"])
    assert "/sentinel/refreshInterval" in err


# ---------------------------------------------------------------------------------------------
# Cross-check with the real Sentinel, when one has been built: it must accept every rendered config.


def _sentinel_binary():
    explicit = os.environ.get("ASTRO_SENTINEL_BIN")
    if explicit:
        return explicit
    for profile in ("release", "debug"):
        path = CHART.parent.parent / "target" / profile / "astro-sentinel"
        if path.is_file():
            return str(path)
    return None


@pytest.mark.parametrize("name", [n for n in VALID_SCENARIOS if load_values(n).get("sentinel", {}).get("enabled")])
def test_real_sentinel_accepts_the_rendered_config(chart, name, tmp_path):
    binary = _sentinel_binary()
    if not binary:
        pytest.skip("no astro-sentinel binary built (cargo build -p astro-sentinel, or set ASTRO_SENTINEL_BIN)")
    values, _ = effective(name)
    config = sentinel_config(chart.render(scenario(name)), values)
    # Same file, with the in-Pod paths moved into the test's folder.
    if "staticTokensFile" in config["auth"]:
        (tmp_path / "tokens").write_text("test-token\n")
        config["auth"]["staticTokensFile"] = str(tmp_path / "tokens")
    if "history" in config:
        config["history"]["path"] = str(tmp_path / "history.bin")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "sa-token").write_text("sa-token\n")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "ASTRO_SENTINEL_AIRFLOW_TOKEN_FILE": str(tmp_path / "airflow-token"),
        "ASTRO_SENTINEL_POSTGRES_URL_FILE": str(tmp_path / "postgres-url"),
        # Stands in for the in-cluster API server the TokenReview mode needs; never contacted here.
        "ASTRO_SENTINEL_KUBERNETES_API_URL": "http://127.0.0.1:1",
        "ASTRO_SENTINEL_KUBERNETES_TOKEN_FILE": str(tmp_path / "sa-token"),
    }
    (tmp_path / "airflow-token").write_text("t\n")
    (tmp_path / "postgres-url").write_text("postgres://u:p@127.0.0.1:1/db\n")
    if values["sentinel"]["source"]["type"] == "airflow-api":
        env.pop("ASTRO_SENTINEL_POSTGRES_URL_FILE")
    # The log format the chart sets (json by default): the binary takes it and every line is JSON.
    rendered_env = env_of(container(chart.render(scenario(name)).get("Deployment", f"{values['resourceNamePrefix']}-sentinel"), "sentinel"))
    log_format = rendered_env["ASTRO_SENTINEL_LOG_FORMAT"]["value"]
    env["ASTRO_SENTINEL_LOG_FORMAT"] = log_format
    proc = subprocess.Popen(
        [binary, "--config", str(tmp_path / "config.yaml"), "--listen", "127.0.0.1:0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        # It logs "listening" once the config is accepted; a rejected config exits 2 first.
        out = b""
        deadline = time.monotonic() + 20
        while b"listening" not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
        assert b"listening" in out, f"exit={proc.poll()}:\n{out.decode(errors='replace')}"
        if log_format == "json":
            lines = out.decode().split("\n")[:-1]  # after the last newline: a line cut short
            assert lines and all(json.loads(line)["message"] for line in lines), out.decode()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
