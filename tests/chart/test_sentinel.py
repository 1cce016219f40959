"""The Sentinel: its config (the KEDA workers it serves, its source and credentials), the Airflow CA,
its history volume and its NetworkPolicy; and the real binary accepting every rendered config,
when one has been built."""

import json
import os
import select
import subprocess
import time

import pytest
import yaml

from conftest import (
    CHART,
    VALID_SCENARIOS,
    container,
    effective,
    env_of,
    load_values,
    scenario,
    sentinel_config,
)

# The Sentinel rejects unknown keys in its config: the chart must render only these.
SENTINEL_CONFIG_KEYS = {"refreshInterval", "stalenessLimit", "source", "auth", "workers", "kubernetes", "history",
                        "schedule", "queueEvents"}
SENTINEL_WORKER_KEYS = {"name", "queues", "syncSlots", "minReplicas", "maxReplicas", "preWarm"}
# An HPA-scaled worker is recorded, not read by KEDA: no pre-warm, and it says what scales it.
SENTINEL_HPA_WORKER_KEYS = {"name", "queues", "syncSlots", "minReplicas", "maxReplicas", "scaledBy"}


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
         "minReplicas": w["keda"]["minReplicaCount"], "maxReplicas": w["keda"]["maxReplicaCount"],
         "preWarm": {"enabled": w["preWarm"]["enabled"]}}
        if w["mode"] == "keda" else
        {"name": w["deployment"], "queues": w["queues"], "syncSlots": w["syncSlots"],
         "minReplicas": w["hpa"]["minReplicaCount"], "maxReplicas": w["hpa"]["maxReplicaCount"],
         "scaledBy": "hpa"}
        for w in workers if w["mode"] in ("keda", "hpa")
    ]
    assert config["workers"] == expected
    for entry in config["workers"]:
        assert set(entry) == (SENTINEL_HPA_WORKER_KEYS if "scaledBy" in entry else SENTINEL_WORKER_KEYS)
    # Empty: half a second with postgres (one query for every queue), two with the REST API.
    default_refresh = "500ms" if values["sentinel"]["source"]["type"] == "postgres" else "2s"
    assert config["refreshInterval"] == (values["sentinel"]["refreshInterval"] or default_refresh)
    assert config["stalenessLimit"] == values["sentinel"]["stalenessLimit"]
    assert config["schedule"] == {"readInterval": values["sentinel"]["schedule"]["readInterval"]}

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
    claim = history["existingClaim"] or (
        f"{values['resourceNamePrefix']}-sentinel-history" if history["persistence"]["mode"] == "pvc" else None)
    strategy = sentinel["spec"].get("strategy", {}).get("type")
    if claim:
        assert volumes["history"]["persistentVolumeClaim"] == {"claimName": claim}
        assert "volatile" not in config["history"]
        assert strategy == "Recreate", "the old Pod lets the claim go before the new one starts"
        assert "fsGroup" in sentinel["spec"]["template"]["spec"]["securityContext"]
    else:
        # `auto` without a cluster to ask (helm template): an emptyDir, and the Sentinel knows.
        assert volumes["history"]["emptyDir"] == {}
        assert config["history"]["volatile"] is True
        assert strategy is None


def _history(r, prefix="astro"):
    pod = r.get("Deployment", f"{prefix}-sentinel")
    (volume,) = [v for v in pod["spec"]["template"]["spec"]["volumes"] if v["name"] == "history"]
    return pod, volume, r.maybe("PersistentVolumeClaim", f"{prefix}-sentinel-history")


def test_sentinel_history_is_on_by_default_and_a_claim_needs_one_replica(chart):
    base = scenario("keda-static")
    r = chart.render(base, sets=["sentinel.replicaCount=2"])
    _, volume, pvc = _history(r)
    assert volume == {"name": "history", "emptyDir": {}}, "one per replica"
    assert pvc is None
    err = chart.render_error(base, sets=["sentinel.replicaCount=2", "sentinel.history.existingClaim=history"])
    assert "sentinel.history.existingClaim" in err and "replicaCount" in err, err
    err = chart.render_error(base, sets=["sentinel.replicaCount=2", "sentinel.history.persistence.mode=pvc"])
    assert "sentinel.history.persistence.mode" in err and "replicaCount" in err, err
    err = chart.render_error(base, sets=["sentinel.history.persistence.mode=disk"])
    assert "/sentinel/history/persistence/mode" in err, err


def test_sentinel_history_claim_made_by_the_chart(chart):
    r = chart.render(scenario("keda-static"), sets=[
        "sentinel.history.persistence.mode=pvc", "sentinel.history.persistence.size=1Gi",
        "sentinel.history.persistence.storageClassName=fast",
        # A podSecurityContext without fsGroup still gets one: the claim must be writable.
        "sentinel.podSecurityContext.runAsGroup=1234"])
    pod, volume, pvc = _history(r)
    assert volume == {"name": "history", "persistentVolumeClaim": {"claimName": "astro-sentinel-history"}}
    assert pvc["spec"] == {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                           "resources": {"requests": {"storage": "1Gi"}}}
    assert pod["spec"]["strategy"] == {"type": "Recreate"}
    assert pod["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 1234
    config = sentinel_config(r, effective("keda-static")[0])
    assert config["history"] == {"path": "/var/lib/astro-sentinel/history.bin"}, "not volatile"

    r = chart.render(scenario("keda-static"), sets=["sentinel.history.persistence.mode=emptyDir"])
    pod, volume, pvc = _history(r)
    assert volume == {"name": "history", "emptyDir": {}} and pvc is None
    assert "strategy" not in pod["spec"]
    config = sentinel_config(r, effective("keda-static")[0])
    assert config["history"]["volatile"] is True, "the page says the history is lost with the Pod"

    r = chart.render(scenario("keda-static"), sets=["sentinel.history.enabled=false"])
    assert "history" not in sentinel_config(r, effective("keda-static")[0])


def test_a_pool_change_keeps_the_sentinel_pod_and_a_fixed_setting_rolls_it(chart):
    """The Sentinel applies its file in place: only what it cannot change at run time may roll it."""
    base = scenario("keda-static")

    def template(*sets):
        return chart.render(base, sets=list(sets)).get("Deployment", "astro-sentinel")["spec"]["template"]

    before = template()
    assert "checksum/config" not in before["metadata"]["annotations"]
    assert "checksum/airflow-secret" in before["metadata"]["annotations"], "secrets still roll it"
    assert template("workers[0].keda.maxReplicaCount=17") == before
    assert template("workers[0].syncSlots=3", "workers[0].queues=other") == before
    assert template("sentinel.refreshInterval=7s") == before
    assert template("sentinel.source.type=postgres", "sentinel.source.postgres.url.value=postgres://u:p@h/d",
                    "sentinel.source.postgres.sslMode=require") != before
    assert template("sentinel.kubernetes.enabled=false") != before


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
    # The worker Pods, whose agents subscribe to the queue events (on by default).
    assert rules[1]["from"] == [{"podSelector": {"matchLabels": {"app": "astro-agent", "component": "worker"}}}]
    assert [rule["from"] for rule in rules[2:]] == ([values["sentinel"]["networkPolicy"]["metricsFrom"]]
                                                   if values["sentinel"]["networkPolicy"]["metricsFrom"] else [])
    for rule in rules:
        assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]


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
        pytest.skip("no astro-sentinel binary built (cargo build --workspace --release, or set ASTRO_SENTINEL_BIN)")
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


def test_people_read_with_their_own_kubernetes_token_by_default(chart):
    """sentinel.kubernetes.userAccess: the Sentinel's config asks for it, and its RBAC allows the
    two reviews and nothing more (TokenReview cluster-wide, LocalSubjectAccessReview in the
    release namespace only)."""
    base = scenario("keda-static")
    values, _ = effective("keda-static")
    r = chart.render(base, sets=("workerDefaults.wake.enabled=false",))
    assert sentinel_config(r, values)["auth"]["kubernetesUsers"] == {}
    (cluster_role,) = r.all("ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]
    role = r.get("Role", "astro-sentinel")
    assert {"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"],
            "verbs": ["create"]} in role["rules"]

    for sets in (("sentinel.kubernetes.userAccess=false",), ("sentinel.kubernetes.enabled=false",)):
        off = chart.render(base, sets=("workerDefaults.wake.enabled=false",) + sets)
        assert "kubernetesUsers" not in sentinel_config(off, values)["auth"], sets
        assert not off.all("ClusterRole"), sets
