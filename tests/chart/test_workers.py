"""The workers: a Deployment and a metrics Service per `workers` entry, the Pod's three containers
(install-agent, the tasks sidecar, the agent), its drain deadline, replicas only without an
autoscaler, and the log format."""

import re

import pytest
import yaml

from conftest import CHART, KUBE_VERSION, ROOT, VALID_SCENARIOS, container, effective, env_of, load_values, scenario

AGENT_PORT = 39091
BIN_DIR = "/opt/astro-agent/bin"
SOCKET = "@astro-agent/task-host"


def _image(img, default_tag):
    return f"{img['repository']}@{img['digest']}" if img["digest"] else f"{img['repository']}:{img['tag'] or default_tag}"


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
        assert 0 < drain < grace
        margin = w["drainMarginSeconds"]
        assert drain == grace - margin
        # The agent shares the rest out (stop the tasks, report them, offline, exit).
        assert env["ASTRO_AGENT_DRAIN_MARGIN"]["value"] == f"{margin}s"

        # The probe keeps a connection however another client floods the port.
        admin = w["adminServer"]
        assert env["ASTRO_AGENT_ADMIN_MAX_CONNECTIONS"]["value"] == str(admin["maxConnections"])
        assert env["ASTRO_AGENT_ADMIN_MAX_CONNECTIONS_PER_PEER"]["value"] == str(admin["maxConnectionsPerPeer"])
        assert env["ASTRO_AGENT_ADMIN_RESERVED_CONNECTIONS"]["value"] == str(admin["reservedConnections"])

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
        # The agent runs no task: it drives the task host in the tasks container, over an
        # abstract socket (no file in a volume a task could replace).
        assert env["ASTRO_AGENT_TASK_HOST_SOCKET"]["value"] == SOCKET
        assert env["ASTRO_AGENT_PYTHON"]["value"] == w["tasks"]["python"]
        assert env["ASTRO_AGENT_LOG_FORMAT"]["value"] == w["logFormat"]
        for extra in w["extraVolumeMounts"]:
            assert mounts[extra["mountPath"]] == extra["name"]
        for extra in w["extraVolumes"]:
            assert volumes[extra["name"]] == extra

        # Image: repository + tag (default appVersion), never a vendor registry.
        chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
        assert c["image"] == _image(w["image"], chart_meta["appVersion"])
        assert c["imagePullPolicy"] == w["image"]["pullPolicy"]

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
    assert env_of(c)["ASTRO_AGENT_DRAIN_TIMEOUT"]["value"] == "540s"
    assert not r.all("ScaledObject") and not r.all("HorizontalPodAutoscaler") and not r.maybe("Deployment", "astro-sentinel")


def test_the_margin_holds_what_the_agent_does_after_the_drain_deadline(chart):
    r = chart.render(scenario("mixed"))
    env = env_of(container(r.get("Deployment", "prod-worker-pinned"), "agent"))
    assert env["ASTRO_AGENT_DRAIN_TIMEOUT"]["value"] == "5s"  # 40 s grace, the least margin (35 s)
    assert env["ASTRO_AGENT_DRAIN_MARGIN"]["value"] == "35s"
    for grace, expected in ((61, 1), (600, 540), (28800, 28740)):
        r = chart.render(scenario("defaults"), sets=[f"workerDefaults.terminationGracePeriodSeconds={grace}"])
        env = env_of(container(r.get("Deployment", "astro-worker-default"), "agent"))
        assert env["ASTRO_AGENT_DRAIN_TIMEOUT"]["value"] == f"{expected}s"
        assert env["ASTRO_AGENT_DRAIN_MARGIN"]["value"] == "60s"
    # 10 s for tasks to exit + 10 s for their reports + 10 s offline + 5 s exit: the agent's
    # least margin (agent/src/stop_budget.rs), refused below it by both.
    err = chart.render_error(scenario("defaults"), sets=["workerDefaults.drainMarginSeconds=34"])
    assert "workers[0].drainMarginSeconds is 34: it must be at least 35" in err
    err = chart.render_error(scenario("defaults"), sets=["workerDefaults.terminationGracePeriodSeconds=60"])
    assert "workers[0].terminationGracePeriodSeconds (60) must be greater than workers[0].drainMarginSeconds (60)" in err


def _bytes(quantity):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(quantity)).groups()
    return float(number) * units.get(unit, 1)


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_disk_is_bounded(chart, name):
    """Every emptyDir of the chart's has a sizeLimit, and the containers' ephemeral-storage limits
    add up to more than the emptyDirs may hold: the kubelet evicts a Pod whose containers and
    emptyDirs together pass that sum, and it should be an emptyDir's own limit that does."""
    _, workers = effective(name)
    r = chart.render(scenario(name))
    for w in workers:
        spec = r.get("Deployment", w["deployment"])["spec"]["template"]["spec"]
        extra = {v["name"] for v in w["extraVolumes"]}
        own = [v for v in spec["volumes"] if "emptyDir" in v and v["name"] not in extra]
        assert {v["name"] for v in own} == {"tmp", "logs", "astro-agent-bin", "tasks-tmp"}
        sizes = {v["name"]: v["emptyDir"]["sizeLimit"] for v in own}
        limits = w["scratchSizeLimits"]
        assert (sizes["logs"], sizes["tasks-tmp"], sizes["tmp"]) == (limits["logs"], limits["tasksTmp"], limits["agentTmp"])
        agent, tasks = container(r.get("Deployment", w["deployment"]), "agent"), container(r.get("Deployment", w["deployment"]), "tasks")
        for c in (agent, tasks):
            assert "ephemeral-storage" in c["resources"]["requests"], c["name"]
        pod_limit = sum(_bytes(c["resources"]["limits"]["ephemeral-storage"]) for c in (agent, tasks))
        assert pod_limit > sum(_bytes(q) for q in sizes.values()), (w["name"], sizes, pod_limit)


def test_the_sentinel_has_its_disk_bounded_too(chart):
    r = chart.render(scenario("keda-static"))
    c = container(r.get("Deployment", "astro-sentinel"), "sentinel")
    assert c["resources"]["requests"]["ephemeral-storage"] and c["resources"]["limits"]["ephemeral-storage"]


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


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_worker_pod_is_an_installer_a_tasks_sidecar_and_the_agent(chart, name):
    """install-agent copies the binary from the agent image into astro-agent-bin; the tasks
    container (a native sidecar) runs it as the task host in the user's Airflow image; the agent
    reaches the task host over an abstract socket (no file on a shared volume); both see the logs
    at logFolder."""
    _, workers = effective(name)
    r = chart.render(scenario(name))
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for w in workers:
        spec = r.get("Deployment", w["deployment"])["spec"]["template"]["spec"]
        assert [c["name"] for c in spec["initContainers"]] == ["install-agent", "tasks"]
        assert [c["name"] for c in spec["containers"]] == ["agent"]
        install, tasks = spec["initContainers"]
        (agent,) = spec["containers"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        for v in ("astro-agent-bin", "logs", "tasks-tmp", "tmp"):
            assert set(volumes[v]) == {"name", "emptyDir"} and set(volumes[v]["emptyDir"]) == {"sizeLimit"}, v

        # install-agent: the agent image, its restricted security context, small, run to completion.
        assert install["image"] == agent["image"] == _image(w["image"], chart_meta["appVersion"])
        assert install["command"] == ["/usr/local/bin/astro-agent", "install", BIN_DIR]
        assert "restartPolicy" not in install and "args" not in install
        assert install["volumeMounts"] == [{"name": "astro-agent-bin", "mountPath": BIN_DIR}]
        assert install["securityContext"] == w["containerSecurityContext"]
        assert install["securityContext"]["readOnlyRootFilesystem"] is True
        assert install["resources"]["limits"]["memory"] == "64Mi" and "env" not in install

        # tasks: a native sidecar, so it outlives the draining agent.
        t = w["tasks"]
        assert tasks["restartPolicy"] == "Always"
        assert tasks["image"] == _image(t["image"], None)
        assert tasks["imagePullPolicy"] == t["image"]["pullPolicy"]
        assert tasks["command"] == [f"{BIN_DIR}/astro-agent", "task-host", "--socket", SOCKET,
                                    "--log-format", w["logFormat"]]
        assert "args" not in tasks and "ports" not in tasks
        assert tasks["env"] == [{"name": "TMPDIR", "value": "/tmp"}, *t["env"]]
        assert tasks.get("envFrom", []) == t["envFrom"]
        assert tasks["resources"] == t["resources"]
        assert tasks["securityContext"] == t["containerSecurityContext"]
        assert tasks["volumeMounts"] == [
            {"name": "astro-agent-bin", "mountPath": BIN_DIR, "readOnly": True},
            {"name": "logs", "mountPath": w["logFolder"]},
            {"name": "tasks-tmp", "mountPath": "/tmp"},
            *t["extraVolumeMounts"],
        ]
        for m in t["extraVolumeMounts"]:
            assert m["name"] in volumes

        # agent: the logs on the same volume as the tasks container's; the socket is a name.
        agent_mounts = {m["name"]: m for m in agent["volumeMounts"]}
        assert agent_mounts["logs"] == {"name": "logs", "mountPath": w["logFolder"]}
        assert "astro-agent-bin" not in agent_mounts and "tasks-tmp" not in agent_mounts
        assert "tmp" not in {m["name"] for m in tasks["volumeMounts"]}
        # Processes stay apart: a task cannot reach the agent through /proc.
        assert "shareProcessNamespace" not in spec
        # kubectl logs/exec without -c reach the agent.
        annotations = r.get("Deployment", w["deployment"])["spec"]["template"]["metadata"]["annotations"]
        assert annotations["kubectl.kubernetes.io/default-container"] == "agent"


def test_tasks_container_defaults(chart):
    """The official Airflow image at the version the project tests, python3 from its PATH, a
    restricted context whose root filesystem stays writable (Airflow writes under AIRFLOW_HOME)."""
    r = chart.render(scenario("defaults"))
    d = r.get("Deployment", "astro-worker-default")
    tasks = container(d, "tasks")
    assert tasks["image"] == "apache/airflow:3.3.2"
    # The Airflow the other stages run tasks with.
    tested = re.search(r"^apache-airflow==(\S+)$", (ROOT / "tests" / "requirements-airflow.txt").read_text(), re.M)
    assert tested and tasks["image"] == f"apache/airflow:{tested.group(1)}"
    assert env_of(container(d, "agent"))["ASTRO_AGENT_PYTHON"]["value"] == "python3"
    assert tasks["securityContext"] == {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert tasks["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"}, "limits": {"memory": "2Gi", "ephemeral-storage": "8Gi"}}
    # A digest wins over the tag; an image with neither is refused (the chart's appVersion is
    # the agent's, no Airflow tag).
    r = chart.render(scenario("defaults"), sets=["workerDefaults.tasks.image.digest=sha256:" + "a" * 64])
    assert container(r.get("Deployment", "astro-worker-default"), "tasks")["image"] == "apache/airflow@sha256:" + "a" * 64
    err = chart.render_error(scenario("defaults"), sets=["workerDefaults.tasks.image.tag="])
    assert "workers[0].tasks.image has neither a tag nor a digest" in err, err


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_no_service_account_token_in_any_container(chart, name):
    _, workers = effective(name)
    r = chart.render(scenario(name))
    for w in workers:
        spec = r.get("Deployment", w["deployment"])["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec.get("serviceAccountName") == (w["serviceAccountName"] or None)
    assert any(w["serviceAccountName"] for w in workers) or name != "mixed"


def test_no_service_account_token_with_or_without_an_account(chart):
    for sets in ([], ["workerDefaults.serviceAccountName=tasks-identity"]):
        spec = chart.render(scenario("defaults"), sets=sets).get("Deployment", "astro-worker-default")["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec.get("serviceAccountName") == ("tasks-identity" if sets else None)


def test_kubernetes_before_native_sidecars_is_refused(chart):
    """Before 1.29 the tasks container would be a plain init container (the Pod never starts)
    or, as an app container, be stopped with the agent: helm refuses such clusters."""
    for old in ("1.28.15", "1.25.0"):
        err = chart.render_error(scenario("defaults"), kube_version=old)
        assert f"chart requires kubeVersion: >=1.29.0-0 which is incompatible with Kubernetes v{old}" in err, err
    for new in ("1.29.0", KUBE_VERSION):
        assert chart.render(scenario("defaults"), kube_version=new).all("Deployment")
    # Without --kube-version helm assumes the version of its own Kubernetes client, recent enough.
    assert chart.render(scenario("defaults"), kube_version=None).all("Deployment")
