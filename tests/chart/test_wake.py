"""Waking idle workers: for each KEDA worker (the Sentinel reads its queues), the agent container
(and it alone)
gets a token projected for the Sentinel's queue-event audience and the settings to subscribe;
the Sentinel's config allows exactly the workers' service accounts, for that audience, and it
may send TokenReviews; the NetworkPolicy lets the worker Pods in. Off per worker, and with the
Sentinel off."""

import pytest

from conftest import NAMESPACE, VALID_SCENARIOS, container, effective, env_of, load_values, scenario, sentinel_config

TOKEN_DIR = "/var/run/secrets/astro-sentinel"


def wake_workers(name):
    values, workers = effective(name)
    return values, [w for w in workers if w["mode"] == "keda" and w["wake"]["enabled"]]


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_each_agent_container_alone_gets_a_token_for_the_sentinel(chart, name):
    values, workers = effective(name)
    r = chart.render(scenario(name))
    audience = values["sentinel"]["queueEvents"]["audience"]
    for w in workers:
        deploy = r.get("Deployment", w["deployment"])
        spec = deploy["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        agent = container(deploy, "agent")
        env = env_of(agent)
        volumes = {v["name"]: v for v in spec["volumes"]}
        if w["mode"] != "keda":
            # The Sentinel knows only the KEDA workers' queues.
            assert "ASTRO_AGENT_SENTINEL_URL" not in env
            assert "sentinel-token" not in volumes
            continue
        assert env["ASTRO_AGENT_SENTINEL_URL"]["value"] == (
            f"http://{values['resourceNamePrefix']}-sentinel.{NAMESPACE}.svc.cluster.local:39092")
        assert env["ASTRO_AGENT_SENTINEL_TOKEN_FILE"]["value"] == f"{TOKEN_DIR}/token"
        assert env["ASTRO_AGENT_SUBSCRIBED_IDLE_FETCH_INTERVAL"]["value"] == w["wake"]["idleFetchInterval"]
        (source,) = volumes["sentinel-token"]["projected"]["sources"]
        assert source == {"serviceAccountToken": {
            "audience": audience, "expirationSeconds": w["wake"]["tokenExpirationSeconds"], "path": "token"}}
        (mount,) = [m for m in agent["volumeMounts"] if m["name"] == "sentinel-token"]
        assert mount == {"name": "sentinel-token", "mountPath": TOKEN_DIR, "readOnly": True}
        # No other container mounts it: the tasks never see the token.
        others = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] != "agent"]
        for c in others:
            assert all(m["name"] != "sentinel-token" for m in c.get("volumeMounts", [])), c["name"]
            assert not any(e["name"].startswith("ASTRO_AGENT_SENTINEL") for e in c.get("env", [])), c["name"]


@pytest.mark.parametrize("name", [n for n in VALID_SCENARIOS if load_values(n).get("sentinel", {}).get("enabled")])
def test_the_sentinel_allows_the_workers_accounts_for_the_stream_only(chart, name):
    values, workers = wake_workers(name)
    r = chart.render(scenario(name))
    config = sentinel_config(r, values)
    users = sorted({f"system:serviceaccount:{NAMESPACE}:{w['serviceAccountName'] or 'default'}" for w in workers})
    events = config["queueEvents"]
    assert events["maxSubscribers"] == values["sentinel"]["queueEvents"]["maxSubscribers"]
    review = events["auth"]["tokenReview"]
    assert sorted(review["allowedUsernames"]) == users
    assert review["audiences"] == [values["sentinel"]["queueEvents"]["audience"]]
    # The readers' allow-list (KEDA) never names a worker.
    assert not set(users) & set(config["auth"].get("tokenReview", {}).get("allowedUsernames", []))
    prefix = values["resourceNamePrefix"]
    assert r.get("Deployment", f"{prefix}-sentinel")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    (role,) = [c for c in r.all("ClusterRole") if c["metadata"]["name"].endswith("-sentinel-tokenreview")]
    assert role["rules"] == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]


def test_a_worker_with_its_own_account_is_allowed_under_it(chart):
    r = chart.render(scenario("keda-static"), sets=("workers[0].serviceAccountName=etl-workers",))
    values, _ = effective("keda-static")
    review = sentinel_config(r, values)["queueEvents"]["auth"]["tokenReview"]
    assert review["allowedUsernames"] == [f"system:serviceaccount:{NAMESPACE}:etl-workers"]


def test_wake_off_leaves_the_pod_and_the_sentinel_as_before(chart):
    values, workers = effective("keda-static")
    r = chart.render(scenario("keda-static"), sets=("workerDefaults.wake.enabled=false",
                                                    "sentinel.kubernetes.userAccess=false"))
    for w in workers:
        deploy = r.get("Deployment", w["deployment"])
        assert "ASTRO_AGENT_SENTINEL_URL" not in env_of(container(deploy, "agent"))
        assert all(v["name"] != "sentinel-token" for v in deploy["spec"]["template"]["spec"]["volumes"])
    config = sentinel_config(r, values)
    assert "auth" not in config["queueEvents"]
    assert not r.all("ClusterRole")
    np = r.get("NetworkPolicy", "astro-sentinel")
    assert all("podSelector" not in f for rule in np["spec"]["ingress"] for f in rule["from"])


@pytest.mark.parametrize("bad, key", [
    ("workerDefaults.wake.tokenExpirationSeconds=60", "tokenExpirationSeconds"),
    ("workerDefaults.wake.idleFetchInterval=soon", "idleFetchInterval"),
    ("sentinel.queueEvents.maxSubscribers=0", "maxSubscribers"),
    ("sentinel.refreshInterval=fast", "refreshInterval"),
])
def test_the_schema_refuses_bad_wake_values(chart, bad, key):
    err = chart.render_error(scenario("keda-static"), sets=(bad,))
    assert key in err, err
