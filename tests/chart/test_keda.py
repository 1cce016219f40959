"""The KEDA path: each KEDA worker's ScaledObject reads its backlog from the Sentinel, and KEDA's
operator proves itself to the Sentinel with a static token or a bound service-account token
(keda.auth.mode). The external-push trigger has its own file, test_external_push.py."""

import base64
import textwrap

import pytest
import yaml

from conftest import (
    ENSURE_SECRETS,
    NAMESPACE,
    RELEASE,
    VALID_SCENARIOS,
    chart_defaults,
    container,
    effective,
    ensure_secrets_args,
    is_hook,
    scenario,
    sentinel_config,
)

SENTINEL_PORT = 39092


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

        # The pre-warm trigger (on by default), then extra triggers appended as given.
        pre_warm = [t for t in spec["triggers"] if t.get("name") == "pre-warm"]
        assert len(pre_warm) == (1 if w["preWarm"]["enabled"] else 0)
        assert spec["triggers"][1 + len(pre_warm):] == w["keda"]["extraTriggers"]

        # The fallback keeps a running pool and never wakes one at zero: its replicas default to
        # the minimum, and a fallback of 0 replicas is none (KEDA would take it for activity).
        explicit = w["keda"]["fallback"]["replicas"]
        replicas = explicit if explicit is not None else w["keda"]["minReplicaCount"]
        if w["keda"]["fallback"]["enabled"] and replicas > 0:
            fb = spec["fallback"]
            assert fb["behavior"] == w["keda"]["fallback"]["behavior"]
            assert fb["replicas"] == replicas
        else:
            assert "fallback" not in spec
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
    backlog, pre_warm, age = so["spec"]["triggers"]
    assert backlog == plain["spec"]["triggers"][0]
    assert pre_warm == plain["spec"]["triggers"][1]
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


@pytest.mark.parametrize("sets, fallback", [
    # Scale to zero: no fallback, so a Sentinel that cannot answer leaves an idle pool at zero.
    ([], None),
    # Asked for: a pool at zero is woken to one worker when the Sentinel cannot answer.
    (["workers[0].keda.fallback.replicas=1"], 1),
    # A pool that never goes to zero keeps at least its minimum.
    (["workers[0].keda.minReplicaCount=2"], 2),
    # 0 replicas is no fallback, whatever the minimum: KEDA would take any for activity.
    (["workers[0].keda.minReplicaCount=2", "workers[0].keda.fallback.replicas=0"], None),
    (["workers[0].keda.fallback.replicas=1", "workers[0].keda.fallback.enabled=false"], None),
])
def test_fallback_never_wakes_a_pool_at_zero(chart, sets, fallback):
    spec = chart.render(scenario("keda-static"), sets=sets).get("ScaledObject", "astro-worker-default-worker")["spec"]
    if fallback is None:
        assert "fallback" not in spec
    else:
        assert spec["fallback"] == {"failureThreshold": 3, "replicas": fallback, "behavior": "currentReplicasIfHigher"}


def test_keda_defaults_from_the_seed(chart):
    so = chart.render(scenario("keda-static")).get("ScaledObject", "astro-worker-default-worker")
    spec = so["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (0, 10, 300)
    # A pool that scales to zero gets no KEDA fallback: KEDA would wake it whenever the Sentinel
    # cannot answer (its first start included); without one KEDA keeps the pool as it is.
    assert "fallback" not in spec
    md = spec["triggers"][0]["metadata"]
    assert md["targetValue"] == "20" and md["activationTargetValue"] == "0"
    # Seeds 002/004: down at most 2 Pods per 60 s after the window; up left to Kubernetes (fast).
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == {"scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Max",
                                      "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]}}


def test_keda_behavior_null_leaves_kubernetes_defaults(chart):
    r = chart.render(scenario("keda-static"), sets=["workerDefaults.keda.behavior=null"])
    spec = r.get("ScaledObject", "astro-worker-default-worker")["spec"]
    assert "advanced" not in spec


def test_keda_behavior_override_keeps_the_gentle_step(chart):
    r = chart.render(scenario("keda-static"), sets=["workerDefaults.keda.behavior.scaleDown.stabilizationWindowSeconds=10"])
    behavior = r.get("ScaledObject", "astro-worker-default-worker")["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 10
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 2, "periodSeconds": 60}]


def test_static_token_is_shared_by_keda_and_the_sentinel(chart):
    values, _ = effective("keda-static")
    # Without the agents' subscriptions, whose tokens the Sentinel reviews (see test_wake.py).
    # Nor people's tokens (sentinel.kubernetes.userAccess, test_sentinel.py).
    r = chart.render(scenario("keda-static"), sets=("workerDefaults.wake.enabled=false",
                                                    "sentinel.kubernetes.userAccess=false"))
    ta = r.get("TriggerAuthentication", "astro-keda-sentinel")
    (target,) = ta["spec"]["secretTargetRef"]
    # No token at render time (a render must be the same every time): the pre-install Job makes
    # the Secret both sides read.
    assert not r.maybe("Secret", target["name"]) and target["key"] == "token"
    assert f"--keda-token-secret={target['name']}" in ensure_secrets_args(r)

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
    worker_labels = {"app": "astro-agent", "component": "worker", "app.kubernetes.io/instance": RELEASE}
    lease = "astro-sentinel-deletion-cost"
    assert config["kubernetes"] == {"namespace": NAMESPACE, "idleFirstScaleIn": True, "workerLabels": worker_labels,
                                    "deletionCostLease": lease}
    # The Sentinel's watches select on these labels: every object it reads must carry them.
    for kind in ("Deployment", "ScaledObject"):
        for obj in r.all(kind):
            if obj["metadata"]["name"] == "astro-sentinel":
                continue
            assert worker_labels.items() <= obj["metadata"]["labels"].items(), obj["metadata"]["name"]
            if kind == "Deployment":
                assert worker_labels.items() <= obj["spec"]["template"]["metadata"]["labels"].items()
    role = r.get("Role", "astro-sentinel")
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        # KEDA's pause annotations: a paused pool is paused in the history, not stuck.
        {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "verbs": ["get", "list", "watch"]},
        # One replica sets deletion costs: the Lease's holder, renewing that Lease only.
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
         "verbs": ["get", "update"]},
    ]
    binding = r.get("RoleBinding", "astro-sentinel")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "astro-sentinel", "namespace": NAMESPACE}]


def test_sentinel_without_kubernetes_access_has_no_api_token(chart):
    values, _ = effective("keda-static")
    r = chart.render(scenario("keda-static"), sets=("sentinel.kubernetes.enabled=false",
                                                    "workerDefaults.wake.enabled=false"))
    assert r.get("Deployment", "astro-sentinel")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    # The only Role is the pre-install Job's own, bound to its own ServiceAccount.
    assert [x["metadata"]["name"] for x in r.all("Role") + r.all("RoleBinding")] == [ENSURE_SECRETS] * 2
    assert all(is_hook(x) for x in r.all("Role") + r.all("RoleBinding")) and not r.all("ClusterRole")
    assert "kubernetes" not in sentinel_config(r, values)


def test_a_static_token_value_is_rendered_and_no_job_runs(chart):
    r = chart.render(scenario("keda-static"), sets=("keda.auth.staticToken.value=given-token-0123456789",))
    secret = r.get("Secret", "astro-keda-sentinel-token")
    assert base64.b64decode(secret["data"]["token"]).decode() == "given-token-0123456789"
    assert not r.maybe("Job", ENSURE_SECRETS)


def test_idle_first_scale_in_off_drops_the_patch_right(chart):
    values, _ = effective("keda-static")
    r = chart.render(scenario("keda-static"), sets=("sentinel.kubernetes.idleFirstScaleIn=false",))
    rules = r.get("Role", "astro-sentinel")["rules"]
    assert rules[1]["verbs"] == ["get", "list", "watch"]
    assert not [rule for rule in rules if "coordination.k8s.io" in rule["apiGroups"]]
    assert sentinel_config(r, values)["kubernetes"]["idleFirstScaleIn"] is False
    assert "deletionCostLease" not in sentinel_config(r, values)["kubernetes"]


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
