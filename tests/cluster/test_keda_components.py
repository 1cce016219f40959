"""KEDA's operator and metrics API server on the stage's control plane, without the chart: a
ScaledObject on a Deployment, reading a tiny backlog endpoint with a bearer token from a
TriggerAuthentication, must make KEDA create its HPA, serve the metric through the aggregated
external.metrics.k8s.io API, and the HPA controller (as its own service account) must read it.

Quick to run on its own: ``tests/cluster/run.sh -k keda_components``.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import socket
import ssl
import threading
from typing import Callable
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.procs import wait_for

from infra.keda_components import METRICS_SERVER, NAMESPACE, OPERATOR
from infra.kube_api import collection_path, condition, object_path

NS = "keda-components"
NAME = "backlog-worker"
BACKLOG = 3
TARGET = 1  # AverageValue per replica: desired = ceil(BACKLOG / TARGET)
METRIC = "s0-metric-api-backlog"  # KEDA's name: s<trigger index>-metric-api-<valueLocation>


class BacklogServer:
    """Answers ``GET /backlog`` with ``{"backlog": N}`` when ``accept(token)`` holds for the
    request's bearer token, 401 otherwise; records the tokens it saw and its verdicts."""

    def __init__(self, address: str, accept: Callable[[str], bool], backlog: int):
        self.backlog = backlog
        self.seen: list[tuple[str | None, bool]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                auth = self.headers.get("Authorization") or ""
                token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
                ok = token is not None and accept(token)
                outer.seen.append((token, ok))
                if not ok:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"backlog": outer.backlog}).encode()
                self.send_response(200 if self.path == "/backlog" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.httpd.server_port}/backlog"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "BacklogServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _worker(name: str, url: str, auth_ref: dict) -> list[dict]:
    """A Deployment whose pods never run (no node matches; the HPA counts them once created)
    and a ScaledObject reading ``url`` with the TriggerAuthentication ``auth_ref``."""
    labels = {"app": name}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
         "spec": {
             "selector": {"matchLabels": labels},
             "template": {"metadata": {"labels": labels}, "spec": {
                 "nodeSelector": {"astro-agent.test/no-such-node": "true"},
                 "containers": [{"name": "worker", "image": "registry.invalid/worker:0"}],
             }},
         }},
        {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name, "namespace": NS},
         "spec": {
             "scaleTargetRef": {"name": name},
             "pollingInterval": 2,
             "minReplicaCount": 1,
             "maxReplicaCount": 5,
             "triggers": [{
                 "type": "metrics-api",
                 "metadata": {"url": url, "valueLocation": "backlog", "targetValue": str(TARGET),
                              "authMode": "bearer"},
                 "authenticationRef": auth_ref,
             }],
         }},
    ]


def _create(keda, *objects: dict) -> None:
    for obj in objects:
        keda.api.call("POST", collection_path(obj["apiVersion"], obj["kind"], NS), obj)


@pytest.fixture(scope="module")
def scaled(keda):
    """A worker scaled on the backlog server with a static token (a Secret and a
    TriggerAuthentication); the namespace is deleted afterwards."""
    token = secrets.token_urlsafe(24)
    with BacklogServer(keda.address, lambda t: t == token, BACKLOG) as server:
        _create(
            keda,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "backlog-token", "namespace": NS},
             "stringData": {"token": token}},
            {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication",
             "metadata": {"name": "backlog-auth", "namespace": NS},
             "spec": {"secretTargetRef": [{"parameter": "bearerToken", "name": "backlog-token", "key": "token"}]}},
            *_worker(NAME, server.url, {"name": "backlog-auth"}),
        )
        try:
            yield server
        finally:
            keda.api.request("DELETE", f"/api/v1/namespaces/{NS}")


def _metric_path(name: str) -> str:
    selector = urllib.parse.quote(f"scaledobject.keda.sh/name={name}")
    return f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/{METRIC}?labelSelector={selector}"


def _read_metric(keda, name: str) -> dict:
    def read():
        status, body = keda.api.request("GET", _metric_path(name))
        return status == 200 and body

    return wait_for(read, 60, f"GET {_metric_path(name)}", on_timeout=keda.tails)


def _hpa(keda) -> dict | None:
    return keda.api.get(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/keda-hpa-{NAME}")


def test_crds_established(keda):
    assert {"scaledobjects.keda.sh", "scaledjobs.keda.sh", "triggerauthentications.keda.sh",
            "clustertriggerauthentications.keda.sh"} <= set(keda.crd_names)
    for name in keda.crd_names:
        crd = keda.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        assert condition(crd, "Established") == "True", name


def test_apiservice_trusts_kedas_own_ca(keda):
    """The operator patched the caBundle with the CA it generated into kedaorg-certs."""
    api_service = keda.api.get("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.external.metrics.k8s.io")
    assert condition(api_service, "Available") == "True", api_service.get("status")
    assert base64.b64decode(api_service["spec"]["caBundle"]) == (keda.cert_dir / "ca.crt").read_bytes()
    assert not api_service["spec"].get("insecureSkipTLSVerify")


def test_keda_creates_the_hpa(keda, scaled):
    hpa = wait_for(lambda: _hpa(keda), 60, f"KEDA to create keda-hpa-{NAME}", on_timeout=keda.tails)
    owner = hpa["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("ScaledObject", NAME)
    assert hpa["spec"]["scaleTargetRef"]["name"] == NAME
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == METRIC
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"scaledobject.keda.sh/name": NAME}
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": str(TARGET)}

    def ready_and_active():
        so = keda.api.get(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/{NAME}")
        return condition(so, "Ready") == "True" and condition(so, "Active") == "True"

    wait_for(ready_and_active, 60, "the ScaledObject to be Ready and Active", on_timeout=keda.tails)


def test_external_metric_through_the_aggregator(keda, scaled):
    body = _read_metric(keda, NAME)
    (item,) = body["items"]
    assert item["metricName"] == METRIC
    assert item["value"] == str(BACKLOG)
    # Every call KEDA made carried the TriggerAuthentication's token.
    assert scaled.seen and all(ok for _, ok in scaled.seen)


def test_hpa_controller_reads_the_metric(keda, scaled):
    """The HPA controller runs as kube-system:horizontal-pod-autoscaler: it reads the metric
    only through the keda-external-metrics-reader binding, and acts on it."""
    want = -(-BACKLOG // TARGET)

    def acted():
        hpa = _hpa(keda) or {}
        status = hpa.get("status") or {}
        current = [m for m in status.get("currentMetrics") or [] if m.get("type") == "External"]
        return status.get("desiredReplicas") == want and current and hpa

    hpa = wait_for(acted, 90, f"the HPA to want {want} replicas from the external metric",
                   on_timeout=lambda: json.dumps((_hpa(keda) or {}).get("status"), indent=1) + "\n" + keda.tails())
    assert condition(hpa, "ScalingActive") == "True"
    current = hpa["status"]["currentMetrics"][0]["external"]
    assert current["metric"]["name"] == METRIC


def test_metrics_server_delegates_authorization(keda, scaled):
    """Straight to the metrics server: it authenticates a bearer token with a TokenReview and
    authorizes it with a SubjectAccessReview (system:auth-delegator), so an account without
    RBAC on external metrics is refused and the cluster admin is not."""
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "no-metrics", "namespace": NAMESPACE}}
    keda.api.apply(sa)
    nobody = keda.api.create_token(NAMESPACE, "no-metrics", seconds=600)
    ctx = ssl.create_default_context(cafile=str(keda.cert_dir / "ca.crt"))
    host = f"{METRICS_SERVER}.{NAMESPACE}.svc"  # a name KEDA's certificate carries
    path = _metric_path(NAME)

    def status(token: str) -> int:
        # To the process's address, verifying the certificate against the Service's name.
        with socket.create_connection((keda.address, keda.ports.secure), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as tls:
                conn = http.client.HTTPConnection(host)
                conn.sock = tls
                conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
                return conn.getresponse().status

    try:
        assert status(nobody) == 403
        assert status("not-a-token") == 401
        assert status(keda.api.token) == 200
    finally:
        keda.api.request("DELETE", object_path(sa))


def test_bound_token_with_audience(keda, scaled):
    """What the chart's boundServiceAccountToken mode relies on: KEDA 2.21 mints a token for an
    identity ServiceAccount only with the audience KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES maps it
    to, as the keda-operator account, which may mint for that one account only (the chart's Role
    and RoleBinding); the backlog server checks it with a TokenReview for that audience, as the
    Sentinel does."""
    identity, audience, name = "bound-identity", "backlog-test", "bound-worker"
    minter = {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [identity],
              "verbs": ["create"]}
    cluster_objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": identity, "namespace": NAMESPACE},
         "automountServiceAccountToken": False},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": f"{identity}-token-minter", "namespace": NAMESPACE}, "rules": [minter]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{identity}-token-minter", "namespace": NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{identity}-token-minter"},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]},
    ]
    cta = {"apiVersion": "keda.sh/v1alpha1", "kind": "ClusterTriggerAuthentication", "metadata": {"name": identity},
           "spec": {"boundServiceAccountToken": [{"parameter": "bearerToken", "serviceAccountName": identity}]}}
    cta_path = f"/apis/keda.sh/v1alpha1/clustertriggerauthentications/{identity}"
    reviewed: list[dict] = []

    def accept(token: str) -> bool:
        review = keda.api.call("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]}})
        reviewed.append(review["status"])
        status = review["status"]
        return bool(status.get("authenticated")) and \
            status["user"]["username"] == f"system:serviceaccount:{NAMESPACE}:{identity}"

    before = keda.token_audiences
    with BacklogServer(keda.address, accept, BACKLOG) as server:
        try:
            for obj in cluster_objects:
                keda.api.apply(obj)
            keda.api.call("POST", "/apis/keda.sh/v1alpha1/clustertriggerauthentications", cta)
            keda.set_token_audiences(before + [
                {"namespace": NAMESPACE, "serviceAccountName": identity, "audience": audience}])
            _create(keda, *_worker(name, server.url, {"name": identity, "kind": "ClusterTriggerAuthentication"}))
            (item,) = _read_metric(keda, name)["items"]
            assert item["value"] == str(BACKLOG)
            assert any(r.get("authenticated") and r.get("audiences") == [audience] for r in reviewed)
        finally:
            keda.api.request("DELETE", cta_path)
            for obj in cluster_objects:
                keda.api.request("DELETE", object_path(obj))
            keda.set_token_audiences(before)
