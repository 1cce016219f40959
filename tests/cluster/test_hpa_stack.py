"""The HPA path's peers work on the real control plane, before any worker pod runs: Prometheus
finds a worker Service through Kubernetes service discovery and scrapes it with the labels the
chart's ServiceMonitor gives (``job`` = the Deployment name), prometheus-adapter serves the
chart's metric for that Deployment through the aggregation layer to the identity the HPA
controller uses, and the real HPA controller acts on the chart's HPA with it.

The "worker" is the chart's own worker Service with its selector removed, Endpoints written by
hand to a small HTTP server in this process on the cluster address, and a Pod object for the
endpoint to refer to (Prometheus takes the ``pod`` label from it, and the chart's adapter rule
requires one). That Pod, and those of the chart's Deployment, carry a scheduling gate: nothing
schedules or runs them, so the test needs no kubelet.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.procs import wait_for

from conftest import BIN
from infra.control_plane import ADDRESS
from infra.hpa_stack import HPA_CONTROLLER, HpaMetricsStack, KubeApi, KubeError

RELEASE = "astro"
METRIC = "astro_agent_client_queued_or_running_tasks"
# What a worker exports for a queue with 7 queued tasks (Prometheus text format).
METRICS_BODY = (
    "# HELP astro_agent_client_queue_stats Task instances on the queue in the given state.\n"
    "# TYPE astro_agent_client_queue_stats gauge\n"
    'astro_agent_client_queue_stats{queue="q",state="queued"} 7\n'
)
SYNC_SLOTS = 2  # the HPA's target per replica: 7 queued asks for ceil(7 / 2) = 4 replicas
# On top of the chart's HPA scenario (tests/chart/values/hpa.yaml): one worker whose HPA has only
# the adapter's metric (that scenario's extra memory metric needs metrics.k8s.io, not served here).
WORKER_VALUES = {"workers": [{
    "name": "default-worker", "queues": "default", "syncSlots": SYNC_SLOTS,
    "hpa": {"enabled": True, "minReplicaCount": 1, "maxReplicaCount": 5},
}]}
GATE = {"name": "astro-agent.test/never"}


@pytest.fixture(params=["endpoints", "endpointslice"])
def stack(request, control_plane, tmp_path):
    # Both discovery roles prometheus-operator can generate (its default, and EndpointSlice),
    # each in a namespace of its own so that nothing of the first run is in the second's way.
    namespace = f"hpa-stack-{request.param}"
    api = KubeApi(control_plane.server, control_plane.token, control_plane.ca_file)
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        with HpaMetricsStack(tmp_path / "stack", BIN, control_plane, namespace, ADDRESS, release=RELEASE,
                             values=WORKER_VALUES, discovery_role=request.param) as s:
            print(f"\nHPA metrics stack ({request.param}) up in {s.timings['total']:.1f}s "
                  f"(Prometheus {s.timings['prometheus']:.1f}s, adapter {s.timings['adapter']:.1f}s)")
            yield s
    finally:
        api.delete(f"/api/v1/namespaces/{namespace}")


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        found = self.path == "/metrics"
        body = METRICS_BODY.encode() if found else b"not found\n"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # Prometheus scrapes every 2 s: keep the test output quiet
        pass


@pytest.fixture
def metrics_port():
    server = ThreadingHTTPServer((ADDRESS, 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _rendered(stack: HpaMetricsStack, kind: str) -> dict:
    (obj,) = [o for o in stack.objects if o["kind"] == kind and o["metadata"].get("labels", {}).get("component") == "worker"]
    return obj


def _fake_worker(stack: HpaMetricsStack, port: int) -> tuple[str, str, str]:
    """The chart's worker Service without its selector, a gated Pod and hand-written Endpoints
    to the metrics server; returns the names of the Deployment, the Pod and the Service."""
    api, namespace = stack.api, stack.namespace
    service = _rendered(stack, "Service")
    deployment = service["metadata"]["labels"]["deploymentName"]
    selector = service["spec"].pop("selector")  # with it, the endpoints controller would own the Endpoints
    # The chart names the Service after the Deployment; another name here shows that `job` comes
    # from the deploymentName label (the ServiceMonitor's jobLabel), not from the Service name.
    service["metadata"]["name"] = f"{deployment}-metrics"
    pod_name = f"{deployment}-6d5f7c9b8-x2x7q"
    # The ServiceAccount admission plugin refuses Pods until the namespace's default account exists.
    wait_for(lambda: api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"), 60,
             "the namespace's default service account")
    api.apply(service)
    api.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "labels": selector},
        "spec": {
            "schedulingGates": [GATE],
            "automountServiceAccountToken": False,
            "containers": [{"name": "agent", "image": "astro-agent:test",
                            "ports": [{"name": "http", "containerPort": port}]}],
        },
    })
    api.apply({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": service["metadata"]["name"], "namespace": namespace},
        "subsets": [{
            "addresses": [{"ip": ADDRESS, "targetRef": {"kind": "Pod", "name": pod_name, "namespace": namespace}}],
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        }],
    })
    return deployment, pod_name, service["metadata"]["name"]


def test_prometheus_discovers_the_worker_and_the_adapter_serves_the_chart_metric(stack, metrics_port):
    namespace = stack.namespace
    deployment, pod_name, service_name = _fake_worker(stack, metrics_port)
    t0 = time.monotonic()

    def scraped():
        return [r["metric"] for r in stack.query("astro_agent_client_queue_stats") if r["value"][1] == "7"]

    (series,) = wait_for(scraped, 60, "Prometheus to scrape the worker Service's endpoint",
                         on_timeout=lambda: f"targets: {stack.targets()}\n{stack.prometheus.log(20)}")
    # The labels prometheus-operator sets for the chart's ServiceMonitor (jobLabel: deploymentName).
    assert series["job"] == deployment
    assert series["namespace"] == namespace
    assert series["pod"] == pod_name
    assert series["service"] == service_name
    assert series["container"] == "agent"
    assert series["endpoint"] == "http"
    assert (series["queue"], series["state"]) == ("q", "queued")

    # The chart's rule: queued + running summed per Deployment, served as an object metric.
    scraped_after = time.monotonic() - t0
    assert stack.wait_custom_metric(namespace, deployment, METRIC, expected=7) == 7
    print(f"scraped {scraped_after:.1f}s after the Endpoints were written, served by the adapter "
          f"after {time.monotonic() - t0:.1f}s")
    assert stack.custom_metric(namespace, deployment, METRIC) == 7.0
    item = stack.custom_metric_item(namespace, deployment, METRIC)
    assert item["describedObject"]["kind"] == "Deployment"
    assert item["describedObject"]["name"] == deployment
    assert item["metricName"] == METRIC

    # The HPA controller's own identity may read it: the RBAC the adapter's install grants,
    # checked by the API server and again by the adapter (delegated authorization).
    hpa_user = f"system:serviceaccount:{HPA_CONTROLLER[0]}:{HPA_CONTROLLER[1]}"
    assert stack.custom_metric_item(namespace, deployment, METRIC, as_user=hpa_user)["value"] in ("7", "7000m")
    # An identity without that grant may not.
    with pytest.raises(KubeError) as refused:
        stack.custom_metric_item(namespace, deployment, METRIC, as_user=f"system:serviceaccount:{namespace}:default")
    assert refused.value.status == 403, refused.value

    # The real HPA controller acts on the chart's HPA with it. The Deployment is the chart's, its
    # pods gated: they count as replicas, and the metric (an Object metric) needs no pod to run.
    worker = _rendered(stack, "Deployment")
    worker["spec"]["template"]["spec"]["schedulingGates"] = [GATE]
    stack.api.apply(worker)
    stack.api.apply(_rendered(stack, "HorizontalPodAutoscaler"))
    hpa_path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{deployment}"

    def scaled_up() -> bool:
        # The chart's scale-up policy adds one pod a minute: 1 -> 2 is the first step towards 4.
        return stack.api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}")["spec"]["replicas"] >= 2

    t0 = time.monotonic()
    wait_for(scaled_up, 60, "the HPA controller to scale the Deployment up on the adapter's metric",
             on_timeout=lambda: str(stack.api.get(hpa_path).get("status")))
    print(f"the HPA controller scaled the Deployment 1 -> 2 after {time.monotonic() - t0:.1f}s")
    # The controller writes the HPA's status after it scaled the Deployment: wait for it.
    def status_written() -> dict | None:
        status = stack.api.get(hpa_path)["status"]
        return status if any(c["type"] == "ScalingActive" for c in status.get("conditions", [])) else None

    status = wait_for(status_written, 30, "the HPA's status with its ScalingActive condition")
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    assert conditions["ScalingActive"]["status"] == "True", conditions
    assert status["desiredReplicas"] >= 2, status
    current = status["currentMetrics"][0]["object"]
    assert current["metric"]["name"] == METRIC and current["describedObject"]["name"] == deployment
