"""Connection settings from existing Secrets or from values turned into a Secret: the agent reads
them through secret references or as files, and no value shows outside a Secret."""

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
