"""The HPA path's peers on the cluster stage's control plane: a real Prometheus that finds the
worker pods through Kubernetes service discovery, and a real prometheus-adapter serving
``custom.metrics.k8s.io`` with the chart's rule, so the real HPA controller can scale a worker
Deployment on ``astro_agent_client_queued_or_running_tasks``.

Prometheus is built from source with Kubernetes service discovery (``build-prometheus.sh``):
Debian's package, which the other stages use, is built without it.

Both configurations come from the chart, not from hand-written copies: :class:`HpaMetricsStack` renders the
chart (``helm template``) and takes

* its worker ServiceMonitor, turned into the scrape config prometheus-operator would generate for
  it (:func:`service_monitor_scrape_configs`: ``job`` = the Service's ``deploymentName`` label,
  plus the ``namespace``, ``service``, ``pod``, ``container`` and ``endpoint`` labels), and
* its prometheus-adapter rules ConfigMap (``prometheusAdapter.rules.enabled``), whose
  ``config.yaml`` is the adapter's ``--config``.

What a cluster with kube-prometheus-stack and the prometheus-adapter chart has, this has too:
service accounts for Prometheus and the adapter with their charts' RBAC (so discovery, the
adapter's delegated authentication and authorization, and the HPA controller's read of
custom.metrics.k8s.io all go through real RBAC checks), the adapter behind a Service and the
``v1beta1.custom.metrics.k8s.io`` APIService with a real CA bundle. The processes run on this
machine (Prometheus on 127.0.0.1, the adapter on the cluster address, where the aggregation
layer reaches it through the Service's EndpointSlice) and are stopped by PID.

The API server needs its aggregation layer configured (front-proxy CA and client certificate,
``--enable-aggregator-routing=true``), as ``control_plane.py`` does.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import sys
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable

import yaml

from harness import certs
from harness.procs import Daemon, StartupError, starting, wait_for
from harness.prometheus_server import PrometheusServer

from infra.helm_release import render_chart
from infra.kube_api import KubeApi, KubeError, write_kubeconfig  # noqa: F401  (KubeError: for the tests)

_TESTS = Path(__file__).resolve().parents[2]

# The chart's HPA scenario: workers with `hpa`, the worker ServiceMonitor and the adapter rules.
DEFAULT_VALUES = (_TESTS / "chart" / "values" / "hpa.yaml",)
MONITORING = "monitoring"
ADAPTER = "prometheus-adapter"
PROMETHEUS = "prometheus"
CUSTOM_METRICS_API = "/apis/custom.metrics.k8s.io/v1beta1"
# The service account the HPA controller acts as when kube-controller-manager runs with
# --use-service-account-credentials (as kubeadm clusters do).
HPA_CONTROLLER = ("kube-system", "horizontal-pod-autoscaler")


# ---- the chart's ServiceMonitor as prometheus-operator would configure Prometheus -----------

def sanitize_label_name(name: str) -> str:
    """Prometheus' meta-label form of a Kubernetes label key (what the operator does too)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def service_monitor_scrape_configs(
    service_monitor: dict,
    *,
    api_server: str,
    ca_file: Path | str,
    token_file: Path | str,
    role: str = "endpoints",
    interval: str | None = None,
) -> list[dict]:
    """The scrape configs prometheus-operator generates for ``service_monitor`` (one per
    endpoint), for a Prometheus outside the cluster: ``kubernetes_sd_configs`` point at
    ``api_server`` with a CA file and a bearer-token file instead of the in-cluster config.

    Covers what the chart's ServiceMonitors use: ``selector.matchLabels``,
    ``namespaceSelector.matchNames``, ``jobLabel``, ``targetLabels``/``podTargetLabels``, and per
    endpoint ``port``, ``path``, ``scheme``, ``interval``, ``scrapeTimeout``. ``role`` is the
    operator's ``serviceDiscoveryRole``: ``endpoints`` (its default) or ``endpointslice``.
    ``interval`` overrides every endpoint's interval (tests want seconds, not the chart's 30 s).
    The relabelling follows the operator's, rule for rule, minus sharding (one shard).
    """
    if role not in ("endpoints", "endpointslice"):
        raise ValueError(f"unsupported discovery role {role!r}")
    meta, spec = service_monitor["metadata"], service_monitor["spec"]
    supported = {"jobLabel", "namespaceSelector", "selector", "endpoints", "targetLabels", "podTargetLabels"}
    if set(spec) - supported or set(spec.get("selector", {})) - {"matchLabels"}:
        raise ValueError(f"ServiceMonitor fields this translation does not cover: {sorted(set(spec) - supported)} "
                         f"(selector: {sorted(spec.get('selector', {}))})")
    names = spec.get("namespaceSelector", {}).get("matchNames") or [meta["namespace"]]
    if spec.get("namespaceSelector", {}).get("any"):
        names = []
    # endpointslice meta labels carry "endpointslice" where endpoints ones carry "endpoint".
    ep = "endpointslice" if role == "endpointslice" else "endpoint"
    configs = []
    for index, endpoint in enumerate(spec["endpoints"]):
        unsupported = set(endpoint) - {"port", "path", "scheme", "interval", "scrapeTimeout"}
        if unsupported or "port" not in endpoint:
            raise ValueError(f"ServiceMonitor endpoint fields this translation does not cover: {sorted(unsupported)}")
        relabel: list[dict] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
        for key, value in sorted(spec.get("selector", {}).get("matchLabels", {}).items()):
            label = sanitize_label_name(key)
            relabel.append({
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_service_label_{label}",
                                  f"__meta_kubernetes_service_labelpresent_{label}"],
                "regex": f"({value});true",
            })
        relabel += [
            {"action": "keep", "source_labels": [f"__meta_kubernetes_{ep}_port_name"], "regex": endpoint["port"]},
            {"source_labels": [f"__meta_kubernetes_{ep}_address_target_kind", f"__meta_kubernetes_{ep}_address_target_name"],
             "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
            {"source_labels": [f"__meta_kubernetes_{ep}_address_target_kind", f"__meta_kubernetes_{ep}_address_target_name"],
             "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        ]
        for key in spec.get("targetLabels", []):
            relabel.append({"source_labels": [f"__meta_kubernetes_service_label_{sanitize_label_name(key)}"],
                            "target_label": sanitize_label_name(key), "regex": "(.+)", "replacement": "${1}"})
        for key in spec.get("podTargetLabels", []):
            relabel.append({"source_labels": [f"__meta_kubernetes_pod_label_{sanitize_label_name(key)}"],
                            "target_label": sanitize_label_name(key), "regex": "(.+)", "replacement": "${1}"})
        # The Service name is the fallback `job`; jobLabel wins when the Service carries it.
        relabel.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"})
        if spec.get("jobLabel"):
            relabel.append({"source_labels": [f"__meta_kubernetes_service_label_{sanitize_label_name(spec['jobLabel'])}"],
                            "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
        relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})

        sd: dict[str, Any] = {
            "role": role,
            "api_server": api_server,
            "tls_config": {"ca_file": str(ca_file)},
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
        }
        if names:
            sd["namespaces"] = {"names": list(names)}
        scrape_interval = interval or endpoint.get("interval") or "30s"
        config: dict[str, Any] = {
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
            "honor_labels": False,
            "kubernetes_sd_configs": [sd],
            "scrape_interval": scrape_interval,
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "relabel_configs": relabel,
        }
        timeout = None if interval else endpoint.get("scrapeTimeout")
        if timeout is None and _seconds(scrape_interval) < 10:
            # Unset, the timeout is the global default (10 s), which Prometheus refuses above
            # the interval: a seconds-long test interval is its own timeout.
            timeout = scrape_interval
        if timeout:
            config["scrape_timeout"] = timeout
        configs.append(config)
    return configs


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    raise ValueError(f"unsupported duration {duration!r}")


def quantity(value: str) -> Decimal:
    """A Kubernetes quantity as a number: the adapter answers ``7`` as ``7`` or ``7000m``."""
    suffixes = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
                "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9")}
    number = value.rstrip("numkMG")
    return Decimal(number) * suffixes[value[len(number):]]


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


# ---- the stack --------------------------------------------------------------------------------

class HpaMetricsStack:
    """Prometheus + prometheus-adapter for the workers of one chart release in ``namespace``.

    ``control_plane`` needs ``server``, ``token`` (admin), ``ca_file``; ``bin_dir`` holds the
    ``prometheus-adapter`` binary (build-adapter.sh) and ``prometheus``/``promtool`` with
    Kubernetes service discovery (build-prometheus.sh). ``release`` and ``namespace`` must be the
    chart release's (the ServiceMonitor selects the release's worker Services by its
    ``app.kubernetes.io/instance`` label and watches its namespace). ``values_files``, then
    ``values``, then ``sets`` are the values to render with; of them only ``serviceMonitor.*``
    shapes what this stack reads, and the worker ServiceMonitor and the adapter rules are
    rendered even where the values leave them off: this stack stands for the operator and the
    adapter chart that would read them.

    After :meth:`start`: ``prometheus`` (a ``PrometheusServer``), ``adapter`` (its ``Daemon``),
    ``adapter_url``, ``adapter_config`` (the rule file), ``objects`` (the rendered chart),
    ``service_monitors`` (those of them Prometheus is configured from), ``api`` (a
    :class:`KubeApi` with the admin token), ``timings``.
    """

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        control_plane: Any,
        namespace: str,
        address: str = "10.200.0.1",
        *,
        release: str,
        values_files: Iterable[Path | str] = DEFAULT_VALUES,
        values: dict | None = None,
        sets: Iterable[str] = (),
        scrape_interval: str = "2s",
        relist_interval: str = "5s",
        discovery_role: str = "endpoints",
    ):
        self.workdir = Path(workdir)
        self.bin_dir = Path(bin_dir)
        self.control_plane = control_plane
        self.namespace = namespace
        self.address = address
        self.release = release
        self.values_files = [Path(f) for f in values_files]
        self.values = values
        self.sets = list(sets)
        self.scrape_interval = scrape_interval
        # prometheus-adapter lists the series it serves every 10 min by default: a worker's
        # brand-new series would be unknown to the HPA for that long.
        self.relist_interval = relist_interval
        self.discovery_role = discovery_role
        self.api = KubeApi(control_plane.server, control_plane.token, control_plane.ca_file)
        self.prometheus: PrometheusServer | None = None
        self.adapter: Daemon | None = None
        self.adapter_port: int | None = None
        self.adapter_url: str | None = None
        self._apiservice: dict | None = None
        # Seconds from start() until Prometheus was ready, the adapter was ready, and in total.
        self.timings: dict[str, float] = {}

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> "HpaMetricsStack":
        """Start Prometheus and the adapter and register the adapter with the aggregation layer;
        return once ``/apis/custom.metrics.k8s.io/v1beta1`` answers through the API server.
        Stops what it started on failure."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with starting(self) as mark:
            self._render()
            self._apply_monitoring_namespace_and_rbac()
            self._start_prometheus(timeout)
            mark("prometheus")
            self._start_adapter(timeout)
            mark("adapter")
            self._register_apiservice(timeout)
        return self

    def stop(self) -> None:
        """Unregister the APIService, then stop the adapter and Prometheus (idempotent).

        The APIService goes first: an aggregated API whose server is gone makes discovery
        incomplete for every client (helm included) for as long as it stays registered."""
        try:
            if self._apiservice is not None:
                self.api.delete(self._apiservice)
                self._apiservice = None
        except (OSError, KubeError) as e:  # the API server may already be gone
            print(f"hpa_stack: could not delete the APIService: {e}", file=sys.stderr)
        finally:
            if self.adapter is not None:
                self.adapter.stop(timeout=15)
            if self.prometheus is not None:
                self.prometheus.stop()

    def __enter__(self) -> "HpaMetricsStack":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- helpers for tests ---------------------------------------------------------------------

    def query(self, promql: str) -> list[dict]:
        """An instant PromQL query against the stack's Prometheus (the result vector)."""
        assert self.prometheus is not None, "start() first"
        return self.prometheus.query(promql)

    def targets(self) -> list[dict]:
        assert self.prometheus is not None, "start() first"
        return self.prometheus.targets()

    def custom_metric_item(self, namespace: str, deployment: str, metric: str, *,
                           as_user: str | None = None) -> dict | None:
        """``GET /apis/custom.metrics.k8s.io/v1beta1/namespaces/NS/deployments.apps/NAME/METRIC``
        through the API server: the metric's item (``describedObject``, ``metricName``, ``value``
        as a quantity string, see :func:`quantity`), or None while the adapter has no such series
        (404).

        ``as_user`` impersonates a user (the admin token may), e.g. the HPA controller's
        ``system:serviceaccount:kube-system:horizontal-pod-autoscaler``, to check what that
        identity may read."""
        path = f"{CUSTOM_METRICS_API}/namespaces/{namespace}/deployments.apps/{deployment}/{metric}"
        headers = {"Impersonate-User": as_user} if as_user else None
        try:
            answer = self.api.call("GET", path, headers=headers)
        except KubeError as e:
            if e.status == 404:
                return None
            raise
        items = answer.get("items", []) if answer.get("kind") == "MetricValueList" else [answer]
        return items[0] if items else None

    def custom_metric(self, namespace: str, deployment: str, metric: str) -> float | None:
        """The metric's value for the Deployment as the HPA controller reads it (milli-units
        resolved: ``7000m`` is 7.0), or None while the adapter has no such series."""
        item = self.custom_metric_item(namespace, deployment, metric)
        return None if item is None else float(quantity(item["value"]))

    def wait_custom_metric(self, namespace: str, deployment: str, metric: str, expected: Decimal | int | float | None = None,
                           timeout: float = 60.0) -> Decimal:
        """Poll until the adapter serves ``metric`` for the Deployment (and, with ``expected``,
        with that value); return the value."""
        seen: list[Decimal] = []

        def ready() -> bool:
            self.adapter.check_alive()
            item = self.custom_metric_item(namespace, deployment, metric)
            value = None if item is None else quantity(item["value"])
            if value is None or (expected is not None and value != Decimal(str(expected))):
                return False
            seen.append(value)  # returned below: a value of 0 would not count as truthy here
            return True

        def diagnose() -> str:
            series = self.query('{__name__="astro_agent_client_queue_stats"}')
            return (f"last answer: {self.custom_metric_item(namespace, deployment, metric)}\n"
                    f"series: {series}\nadapter log:\n{self.adapter.tail(30)}")

        what = f"custom metric {metric} of deployments.apps/{deployment} in {namespace}"
        if expected is not None:
            what += f" = {expected}"
        wait_for(ready, timeout, what, interval=0.5, on_timeout=diagnose)
        return seen[-1]

    # ---- set-up --------------------------------------------------------------------------------

    def _render(self) -> None:
        files = list(self.values_files)
        if self.values is not None:
            files.append(self.workdir / "values.yaml")
            files[-1].write_text(yaml.safe_dump(self.values))
        self.objects = render_chart(self.release, self.namespace, files, [
            *self.sets, "serviceMonitor.workers.enabled=true", "prometheusAdapter.rules.enabled=true",
        ])
        # Every ServiceMonitor the release renders, as the operator would pick them all up (the
        # Sentinel's too, where the values enable it); the workers' one must be among them.
        self.service_monitors = [o for o in self.objects if o["kind"] == "ServiceMonitor"]
        if not any(m["metadata"]["name"].endswith("-workers") for m in self.service_monitors):
            raise RuntimeError("the chart rendered no worker ServiceMonitor: does the release have workers?")
        rules = [o for o in self.objects if o["kind"] == "ConfigMap"
                 and o["metadata"]["name"].endswith("-prometheus-adapter-rules")]
        if len(rules) != 1:
            raise RuntimeError(f"expected the chart's prometheus-adapter rules ConfigMap, found {len(rules)}")
        self.adapter_config = self.workdir / "adapter-config.yaml"
        self.adapter_config.write_text(rules[0]["data"]["config.yaml"])

    def _apply_monitoring_namespace_and_rbac(self) -> None:
        def sa(name: str) -> dict:
            return {"kind": "ServiceAccount", "name": name, "namespace": MONITORING}

        def cluster_role(name: str, rules: list[dict]) -> dict:
            return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": name}, "rules": rules}

        def binding(kind: str, name: str, role_kind: str, role: str, subject: dict, namespace: str | None = None) -> dict:
            meta = {"name": name, **({"namespace": namespace} if namespace else {})}
            return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                    "subjects": [subject]}

        read = ["get", "list", "watch"]
        objects = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MONITORING}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PROMETHEUS, "namespace": MONITORING}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ADAPTER, "namespace": MONITORING}},
            # Prometheus: what kube-prometheus-stack grants it for Kubernetes service discovery.
            cluster_role(f"{MONITORING}:{PROMETHEUS}", [
                {"apiGroups": [""], "resources": ["nodes", "services", "endpoints", "pods"], "verbs": read},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
            ]),
            binding("ClusterRoleBinding", f"{MONITORING}:{PROMETHEUS}", "ClusterRole", f"{MONITORING}:{PROMETHEUS}", sa(PROMETHEUS)),
            # prometheus-adapter, as its own manifests/chart: read what its rules map labels to,
            # delegate authentication (TokenReview) and authorization (SubjectAccessReview), and
            # read the front-proxy CA the aggregator's requests are checked against.
            cluster_role(f"{MONITORING}:{ADAPTER}:resource-reader", [
                {"apiGroups": [""], "resources": ["nodes", "namespaces", "pods", "services"], "verbs": read},
            ]),
            binding("ClusterRoleBinding", f"{MONITORING}:{ADAPTER}:resource-reader", "ClusterRole",
                    f"{MONITORING}:{ADAPTER}:resource-reader", sa(ADAPTER)),
            binding("ClusterRoleBinding", f"{MONITORING}:{ADAPTER}:system:auth-delegator", "ClusterRole",
                    "system:auth-delegator", sa(ADAPTER)),
            binding("RoleBinding", f"{MONITORING}:{ADAPTER}:auth-reader", "Role",
                    "extension-apiserver-authentication-reader", sa(ADAPTER), namespace="kube-system"),
            # The HPA controller may read custom metrics (the adapter's hpa-controller-custom-metrics).
            cluster_role("custom-metrics-server-resources", [
                {"apiGroups": ["custom.metrics.k8s.io"], "resources": ["*"], "verbs": ["*"]},
            ]),
            binding("ClusterRoleBinding", "hpa-controller-custom-metrics", "ClusterRole", "custom-metrics-server-resources",
                    {"kind": "ServiceAccount", "name": HPA_CONTROLLER[1], "namespace": HPA_CONTROLLER[0]}),
        ]
        for obj in objects:
            self.api.apply(obj)

    def _start_prometheus(self, timeout: float) -> None:
        token_file = self.workdir / "prometheus.token"
        token_file.write_text(self.api.create_token(MONITORING, PROMETHEUS))
        token_file.chmod(0o600)
        scrape_configs = [
            config
            for monitor in self.service_monitors
            for config in service_monitor_scrape_configs(
                monitor, api_server=self.control_plane.server, ca_file=self.control_plane.ca_file,
                token_file=token_file, role=self.discovery_role, interval=self.scrape_interval,
            )
        ]
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": scrape_configs,
        }
        for tool in ("prometheus", "promtool"):
            if not (self.bin_dir / tool).is_file():
                raise StartupError(f"no {tool} in {self.bin_dir}: build-prometheus.sh builds it (Debian's "
                                   "package has no Kubernetes service discovery)")
        self.prometheus = PrometheusServer(config, folder=self.workdir / "prometheus", bin_dir=self.bin_dir)
        self.prometheus.start(timeout=timeout)

    def _start_adapter(self, timeout: float) -> None:
        pki = self.workdir / "adapter-pki"
        # The aggregator checks the serving certificate against the Service's DNS name and the
        # APIService's caBundle: a CA of its own, as cert-manager would make for the adapter chart.
        self.adapter_ca = certs.make_ca(pki, "prometheus-adapter-ca")
        serving = certs.issue(
            self.adapter_ca, pki, "serving", ADAPTER, ips=(self.address,),
            dns=(f"{ADAPTER}.{MONITORING}.svc", f"{ADAPTER}.{MONITORING}.svc.cluster.local"),
        )
        kubeconfig = write_kubeconfig(self.workdir / "adapter.kubeconfig", self.control_plane.server,
                                      self.control_plane.ca_file, ADAPTER, self.api.create_token(MONITORING, ADAPTER))
        self.adapter_port = _free_port(self.address)
        self.adapter_url = f"https://{self.address}:{self.adapter_port}"
        argv = [
            str(self.bin_dir / "prometheus-adapter"),
            f"--prometheus-url={self.prometheus.url}/",
            f"--config={self.adapter_config}",
            f"--metrics-relist-interval={self.relist_interval}",
            f"--secure-port={self.adapter_port}",
            f"--bind-address={self.address}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            # Out of a pod there is no in-cluster config: every client of the adapter gets the
            # service account's kubeconfig, as the in-cluster one would carry its token.
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--v=2",
        ]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir)}
        self.adapter = Daemon(ADAPTER, argv, env, self.workdir / "logs" / f"{ADAPTER}.log", cwd=self.workdir).start()
        context = ssl.create_default_context(cafile=str(self.adapter_ca.cert))

        def ready() -> bool:
            self.adapter.check_alive()
            try:
                with urllib.request.urlopen(f"{self.adapter_url}/readyz", timeout=3, context=context) as r:
                    return r.status == 200
            except OSError:
                return False

        try:
            wait_for(ready, timeout, f"prometheus-adapter at {self.adapter_url}/readyz", on_timeout=self.adapter.tail)
        except TimeoutError as e:
            raise StartupError(str(e)) from None

    def _register_apiservice(self, timeout: float) -> None:
        service = {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": ADAPTER, "namespace": MONITORING},
            "spec": {"type": "ClusterIP", "ports": [{"name": "https", "port": 443, "targetPort": self.adapter_port}]},
        }
        # Selector-less: the adapter is a process here, not a pod, so its endpoint is written by
        # hand. The aggregator routes by EndpointSlice (--enable-aggregator-routing), so a slice
        # it is; without the managed-by label no controller touches it.
        endpoint_slice = {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{ADAPTER}-process", "namespace": MONITORING,
                         "labels": {"kubernetes.io/service-name": ADAPTER}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.adapter_port, "protocol": "TCP"}],
        }
        apiservice = {
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.custom.metrics.k8s.io"},
            "spec": {
                "group": "custom.metrics.k8s.io", "version": "v1beta1",
                "service": {"name": ADAPTER, "namespace": MONITORING, "port": 443},
                "caBundle": base64.b64encode(self.adapter_ca.pem_cert()).decode(),
                "groupPriorityMinimum": 100, "versionPriority": 100,
            },
        }
        self.api.apply(service)
        self.api.apply(endpoint_slice)
        self._apiservice = apiservice
        self.api.apply(apiservice)

        def available() -> bool:
            self.adapter.check_alive()
            try:
                answer = self.api.call("GET", CUSTOM_METRICS_API)
            except KubeError as e:
                if e.status in (404, 503):  # not yet discovered / not yet Available
                    return False
                raise
            return answer.get("groupVersion") == "custom.metrics.k8s.io/v1beta1"

        def diagnose() -> str:
            status = (self.api.get("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.custom.metrics.k8s.io") or {}).get("status")
            return f"APIService status: {status}\nadapter log:\n{self.adapter.tail(30)}"

        try:
            wait_for(available, timeout, f"{CUSTOM_METRICS_API} through the API server", on_timeout=diagnose)
        except TimeoutError as e:
            raise StartupError(str(e)) from None
