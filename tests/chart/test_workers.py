"""The workers: a Deployment and a metrics Service per `workers` entry, the agent's Pod spec, its
drain deadline, replicas only without an autoscaler, and the log format."""

import re

import pytest
import yaml

from conftest import CHART, VALID_SCENARIOS, container, effective, env_of, load_values, scenario

AGENT_PORT = 39091


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
