"""Connection settings from existing Secrets or from values turned into a Secret: the agent reads
them through secret references or as files, in its own container only (the tasks container, where
tasks run, gets none), and no value shows outside a Secret."""

import base64

import pytest

from conftest import VALID_SCENARIOS, container, dump, effective, env_of, scenario

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


def reads_queue_stats(values, w):
    """Whether the worker's agent gets the REST API: only for the queue stats its HPA scales on."""
    return w["mode"] == "hpa" and w["hpa"]["metric"]["enabled"] and bool(values["airflow"]["restApi"]["url"])


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
            if path[0] == "restApi" and not reads_queue_stats(values, w):
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
                 if (path[0] != "restApi" or reads_queue_stats(values, w))
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


def _worker_deployments(r):
    return [d for d in r.all("Deployment") if d["spec"]["template"]["metadata"]["labels"].get("component") == "worker"]


def test_tasks_inherit_the_tasks_containers_variables_and_the_listed_ones(chart):
    r = chart.render(scenario("hpa"), sets=[
        "workerDefaults.tasks.env[0].name=TEAM_BUCKET", "workerDefaults.tasks.env[0].value=b",
        # Passed by the agent's built-in allowlist already (AIRFLOW_*), so not listed: the agent
        # refuses a list naming one of Airflow's server secrets.
        "workerDefaults.tasks.env[1].name=AIRFLOW__CORE__FERNET_KEY", "workerDefaults.tasks.env[1].value=f",
        "workerDefaults.tasks.env[2].name=AIRFLOW_CONN_WAREHOUSE", "workerDefaults.tasks.env[2].value=c",
        # The agent container's variables are its own: they no longer join the list.
        "workerDefaults.env[0].name=AGENT_ONLY", "workerDefaults.env[0].value=a",
        "workerDefaults.env[1].name=ASTRO_AGENT_HEARTBEAT_INTERVAL", "workerDefaults.env[1].value=10s",
        "workerDefaults.taskEnvAllow[0]=AWS_*",
    ])
    for deploy in _worker_deployments(r):
        env = env_of(container(deploy, "agent"))
        assert env["ASTRO_AGENT_TASK_ENV_ALLOW"]["value"] == "AWS_*,TEAM_BUCKET"
        assert env["AGENT_ONLY"]["value"] == "a" and "TEAM_BUCKET" not in env
        tasks_env = env_of(container(deploy, "tasks"))
        assert tasks_env["TEAM_BUCKET"]["value"] == "b" and "AGENT_ONLY" not in tasks_env
    r = chart.render(scenario("hpa"), sets=["workerDefaults.env[0].name=AGENT_ONLY", "workerDefaults.env[0].value=a"])
    for deploy in _worker_deployments(r):
        assert "ASTRO_AGENT_TASK_ENV_ALLOW" not in env_of(container(deploy, "agent"))


def test_the_agents_settings_are_refused_in_the_tasks_container(chart):
    err = chart.render_error(scenario("hpa"), sets=[
        "workers[0].tasks.env[0].name=ASTRO_AGENT_PYTHON", "workers[0].tasks.env[0].value=python3"])
    assert "workers[0].tasks.env[0] is ASTRO_AGENT_PYTHON: the agent's settings go in workers[0].env" in err, err


@pytest.mark.parametrize("variable, value", [
    ("ASTRO_AGENT_SYNC_SLOTS", "syncSlots"),
    ("ASTRO_AGENT_QUEUES", "queues"),
    ("ASTRO_AGENT_DRAIN_TIMEOUT", "terminationGracePeriodSeconds and drainMarginSeconds"),
])
def test_settings_the_autoscaler_relies_on_are_refused_in_env(chart, variable, value):
    """Set in env, they would silently win over the chart's value that KEDA divides by."""
    err = chart.render_error(scenario("keda-static"), sets=[
        f"workers[0].env[0].name={variable}", "workers[0].env[0].value=8"])
    assert f"workers[0].env[0] is {variable}: set workers[0].{value} instead" in err, err


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_the_tasks_container_holds_no_credential(chart, name):
    """No ASTRO_AGENT_* variable, no secret reference the chart made, no volume but the shared
    emptyDirs, its own /tmp and what the values mount there themselves; the agent's env, envFrom
    and extra mounts stay in the agent container."""
    _, workers = effective(name)
    r = chart.render(scenario(name))
    for w in workers:
        deploy = r.get("Deployment", w["deployment"])
        spec = deploy["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["initContainers"]:
            if c["name"] == "tasks":
                env = c.get("env", [])
                assert not [e for e in env if e["name"].startswith("ASTRO_AGENT_")]
                # Exactly TMPDIR and the values' tasks.env: no secretKeyRef of the chart's.
                assert env == [{"name": "TMPDIR", "value": "/tmp"}, *w["tasks"]["env"]]
                assert c.get("envFrom", []) == w["tasks"]["envFrom"]
                own = {m["name"] for m in w["tasks"]["extraVolumeMounts"]}
                for m in c["volumeMounts"]:
                    assert m["name"] != "airflow-credentials"
                    if m["name"] not in own:
                        assert set(volumes[m["name"]]) == {"name", "emptyDir"} and set(volumes[m["name"]]["emptyDir"]) == {"sizeLimit"}, m
            else:
                # install-agent: the binary and nothing else.
                assert [m["name"] for m in c["volumeMounts"]] == ["astro-agent-bin"] and "env" not in c


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_credentials_and_the_agents_settings_are_in_the_agent_container_only(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    for w in workers:
        deploy = r.get("Deployment", w["deployment"])
        agent = container(deploy, "agent")
        env = env_of(agent)
        for var in [*SECRET_ENV, *SECRET_FILES]:
            if var in env:
                for other in deploy["spec"]["template"]["spec"]["initContainers"]:
                    assert var not in env_of(other), (other["name"], var)
        if reads_queue_stats(values, w):
            assert env["ASTRO_AGENT_REST_API_URL"]["value"] == values["airflow"]["restApi"]["url"]
        else:
            assert "ASTRO_AGENT_REST_API_URL" not in env
        for e in w["env"]:
            assert env[e["name"]] == e
        assert agent.get("envFrom", []) == w["envFrom"]
        mounted = {m["name"] for m in agent["volumeMounts"]}
        assert {m["name"] for m in w["extraVolumeMounts"]} <= mounted
        for other in deploy["spec"]["template"]["spec"]["initContainers"]:
            names = {m["name"] for m in other["volumeMounts"]}
            assert not names & ({"airflow-credentials", "airflow-ca"} | {m["name"] for m in w["extraVolumeMounts"]})


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


def test_only_an_hpa_scaled_on_queue_stats_gives_its_pods_the_rest_api(chart):
    """The REST API credentials are the Sentinel's and the queue stats': a KEDA-scaled worker's
    Pods (and a fixed one's) have neither the URL nor a credential, in a variable or a file."""
    values, workers = effective("mixed")
    r = chart.render(scenario("mixed"))
    modes = {w["mode"] for w in workers}
    assert {"keda", "hpa", "fixed"} <= modes, modes
    rest_secrets = {(s["existingSecret"]["name"], s["existingSecret"]["key"])
                    for s in (values["airflow"]["restApi"][k] for k in ("token", "username", "password"))
                    if s["existingSecret"]["name"]}
    for w in workers:
        deploy = r.get("Deployment", w["deployment"])
        pod = deploy["spec"]["template"]["spec"]
        env = env_of(container(deploy, "agent"))
        rest_env = {name for name in env if name.startswith("ASTRO_AGENT_REST_API_")}
        sources = [(src["secret"]["name"], item["key"])
                   for v in pod["volumes"] if v["name"] == "airflow-credentials"
                   for src in v["projected"]["sources"] for item in src["secret"]["items"]]
        refs = [(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
                for e in env.values() if "secretKeyRef" in e.get("valueFrom", {})]
        rest_given = [s for s in sources + refs if s in rest_secrets or s[1].startswith("rest-api-")]
        if w["mode"] == "hpa":
            assert rest_env == {"ASTRO_AGENT_REST_API_URL", "ASTRO_AGENT_REST_API_USERNAME",
                                "ASTRO_AGENT_REST_API_PASSWORD_FILE"}, (w["name"], rest_env)
            assert rest_given, w["name"]
        else:
            assert not rest_env, (w["name"], rest_env)
            assert not rest_given, (w["name"], rest_given)
