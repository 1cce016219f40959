"""The chart's keda.trigger: external-push — the ScaledObject's trigger, the mutual-TLS
TriggerAuthentication, who makes the certificates, and the Sentinel's gRPC port."""

from conftest import NAMESPACE, ensure_secrets_args, scenario

PUSH = ("workers[0].keda.trigger=external-push",)
GRPC_PORT = 39093
SERVER_SECRET = "astro-sentinel-external-scaler-tls"
CLIENT_SECRET = "astro-keda-external-scaler-tls"
CA_SECRET = "astro-sentinel-external-scaler-ca"
ENSURE = "astro-sentinel-ensure-secrets"
TLS_DIR = "/etc/astro-sentinel/external-scaler-tls"


def test_metrics_api_stays_the_default_and_opens_no_grpc_port(chart):
    r = chart.render(scenario("keda-static"))
    trigger, pre_warm = r.get("ScaledObject", "astro-worker-default-worker")["spec"]["triggers"]
    assert trigger["type"] == "metrics-api" and pre_warm["type"] == "metrics-api"
    assert not r.maybe("Secret", SERVER_SECRET) and not r.maybe("TriggerAuthentication", "astro-keda-sentinel-external-push")
    assert [p["name"] for p in r.get("Service", "astro-sentinel")["spec"]["ports"]] == ["http"]


def test_external_push_trigger_names_the_worker_and_uses_mutual_tls(chart):
    r = chart.render(scenario("keda-static"), sets=PUSH)
    (trigger,) = r.get("ScaledObject", "astro-worker-default-worker")["spec"]["triggers"]
    assert trigger["type"] == "external-push" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "scalerAddress": f"astro-sentinel.{NAMESPACE}.svc.cluster.local:{GRPC_PORT}",
        "worker": "astro-worker-default-worker",
        "activationTargetValue": "0",
    }
    assert trigger["authenticationRef"] == {"kind": "TriggerAuthentication", "name": "astro-keda-sentinel-external-push"}
    ta = r.get("TriggerAuthentication", "astro-keda-sentinel-external-push")
    assert ta["spec"]["secretTargetRef"] == [
        {"parameter": "caCert", "name": CLIENT_SECRET, "key": "ca.crt"},
        {"parameter": "tlsClientCert", "name": CLIENT_SECRET, "key": "tls.crt"},
        {"parameter": "tlsClientKey", "name": CLIENT_SECRET, "key": "tls.key"},
    ]


def test_the_sentinel_serves_grpc_with_the_server_secret(chart):
    r = chart.render(scenario("keda-static"), sets=PUSH)
    service_ports = {p["name"]: p for p in r.get("Service", "astro-sentinel")["spec"]["ports"]}
    assert service_ports["grpc"]["port"] == GRPC_PORT and service_ports["grpc"]["targetPort"] == "grpc"
    deploy = r.get("Deployment", "astro-sentinel")
    (c,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "sentinel"]
    assert {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"} in c["ports"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["ASTRO_SENTINEL_EXTERNAL_SCALER_LISTEN"] == f"0.0.0.0:{GRPC_PORT}"
    assert env["ASTRO_SENTINEL_EXTERNAL_SCALER_TLS_CERT"] == f"{TLS_DIR}/tls.crt"
    assert env["ASTRO_SENTINEL_EXTERNAL_SCALER_TLS_KEY"] == f"{TLS_DIR}/tls.key"
    assert env["ASTRO_SENTINEL_EXTERNAL_SCALER_CLIENT_CA"] == f"{TLS_DIR}/ca.crt"
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == TLS_DIR]
    (vol,) = [v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert vol["secret"]["secretName"] == SERVER_SECRET
    policy = r.get("NetworkPolicy", "astro-sentinel")
    assert {"port": "grpc", "protocol": "TCP"} in policy["spec"]["ingress"][0]["ports"]


def test_the_certificates_are_made_by_the_pre_install_job_not_at_render_time(chart):
    """The certificates themselves are checked where the Job runs: tests/cluster/test_install.py."""
    r = chart.render(scenario("keda-static"), sets=PUSH)
    assert not r.maybe("Secret", SERVER_SECRET) and not r.maybe("Secret", CLIENT_SECRET)
    args = ensure_secrets_args(r)
    assert {f"--external-scaler-ca-secret={CA_SECRET}", f"--external-scaler-server-secret={SERVER_SECRET}",
            f"--external-scaler-client-secret={CLIENT_SECRET}", "--external-scaler-common-name=astro-sentinel"} <= set(args)
    assert [a.partition("=")[2] for a in args if a.startswith("--external-scaler-dns-name=")] == [
        "astro-sentinel", f"astro-sentinel.{NAMESPACE}", f"astro-sentinel.{NAMESPACE}.svc",
        f"astro-sentinel.{NAMESPACE}.svc.cluster.local"]
    (named,) = [rule for rule in r.get("Role", ENSURE)["rules"] if "resourceNames" in rule]
    assert set(named["resourceNames"]) >= {CA_SECRET, SERVER_SECRET, CLIENT_SECRET}


def test_given_secrets_replace_the_generated_ones(chart):
    sets = PUSH + ("sentinel.externalScaler.tls.serverSecret=s", "sentinel.externalScaler.tls.clientSecret=c")
    r = chart.render(scenario("keda-static"), sets=sets)
    assert not r.maybe("Secret", SERVER_SECRET) and not r.maybe("Secret", CLIENT_SECRET)
    assert not [a for a in ensure_secrets_args(r) if a.startswith("--external-scaler")]
    ta = r.get("TriggerAuthentication", "astro-keda-sentinel-external-push")
    assert {t["name"] for t in ta["spec"]["secretTargetRef"]} == {"c"}
    vols = r.get("Deployment", "astro-sentinel")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "external-scaler-tls", "secret": {"secretName": "s"}} in vols


def test_bad_trigger_settings_are_refused(chart):
    err = chart.render_error(scenario("keda-static"), sets=("workers[0].keda.trigger=grpc",))
    assert "/workers/0/keda/trigger" in err and "external-push" in err
    err = chart.render_error(scenario("keda-static"), sets=PUSH + ("sentinel.externalScaler.tls.serverSecret=s",))
    assert "sentinel.externalScaler.tls: set both serverSecret and clientSecret" in err
