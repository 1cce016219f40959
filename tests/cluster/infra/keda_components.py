"""KEDA's real operator and metrics API server, run as processes against the stage's control plane.

:class:`Keda` does what installing KEDA's release manifest does (KEDA's own ``config/`` folder,
which ``build-keda.sh`` ships next to the binaries, so the objects match the code exactly), then
stands in for the kubelet where the pods would have needed one:

* the ``keda`` namespace, KEDA's CRDs (with the patches its kustomization applies), its
  ServiceAccount and RBAC (the operator's ClusterRole comes from the operator's kubebuilder
  markers; the metrics server's delegation bindings; ``keda-external-metrics-reader`` bound to
  the HPA controller's ``horizontal-pod-autoscaler`` account), its Services and the
  ``v1beta1.external.metrics.k8s.io`` APIService. The processes authenticate as the
  ``keda-operator`` ServiceAccount (a TokenRequest token), as the pods do, so that RBAC is
  exercised for real: e.g. the operator can mint a bound token only for the account the chart's
  Role names. KEDA's admission webhooks are not run (their ValidatingWebhookConfiguration and
  Service are left out).
* Services without selectors, each with an EndpointSlice at ``address`` (there are no pods for a
  selector to match, and the API server refuses loopback endpoints): the aggregator, started with
  ``--enable-aggregator-routing=true``, dials the metrics server there.
* Certificates as in a default install: the operator generates KEDA's CA and certificate into
  the ``kedaorg-certs`` Secret and exits so that its pod restarts with the Secret mounted; here
  the first run is awaited, the Secret is written to a folder the way the kubelet projects a
  Secret volume (KEDA's file watcher expects that layout), and the operator is started again.
  It then patches the APIService's caBundle with its CA, which the aggregator verifies the
  metrics server's certificate with.
* The metrics server dials the operator's gRPC metrics service at ``address`` directly, with
  ``--metrics-service-grpc-authority`` set to the Service's DNS name, the name KEDA's
  certificate carries: mutual TLS is still verified and nothing depends on the stage's hosts file
  having caught up with the Service.

Ports are free ports: the Services map their usual port numbers (9666, 443, 8080) to them as
targetPorts. With no kube-proxy, whoever connects by a Service's name must use the endpoint's
port (the aggregator and Prometheus' endpoint discovery do).

KEDA puts finalizers on ScaledObjects and (Cluster)TriggerAuthentications: delete those while
the operator still runs, or their deletion waits forever.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import ssl
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from harness.procs import Daemon, StartupError, free_port, starting, wait_for

from infra.kube_api import KubeApi, condition, object_path, write_kubeconfig  # noqa: F401  (condition: for the tests)

ADDRESS = "10.200.0.1"
NAMESPACE = "keda"
OPERATOR = "keda-operator"  # Deployment, ServiceAccount and Service of the operator
METRICS_SERVER = "keda-metrics-apiserver"  # Deployment and Service of the metrics API server
CERT_SECRET = "kedaorg-certs"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
CLUSTER_DOMAIN = "cluster.local"
# KEDA's configuration folders a release install applies (config/default/kustomization.yaml),
# without ../webhooks: the admission webhooks are not run here.
INSTALL_PARTS = ("crd", "general", "rbac", "manager", "metrics-server", "service_account")


# ---- KEDA's config/ folder: a small kustomize ---------------------------------------------


def _json_patch(doc: Any, ops: list[dict]) -> None:
    """RFC 6902 ``add`` and ``remove`` (all KEDA's CRD patches use), in place."""
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "add":
            if isinstance(node, list):
                node.append(op["value"]) if last == "-" else node.insert(int(last), op["value"])
            else:
                node[last] = op["value"]
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise ValueError(f"unsupported patch op {op['op']!r} in {op['path']}")


def kustomize(folder: Path, parts: Iterable[str] | None = None) -> list[dict]:
    """The objects of a kustomization in KEDA's config/ folder: its resources (folders
    recursively), its JSON 6902 patches and its ``labels``. ``parts`` restricts the top level to
    those sub-folders."""
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text()) or {}
    objects: list[dict] = []
    resources = kust.get("resources") or []
    if parts is not None:
        resources = [f"../{p}" for p in parts]
    for res in resources:
        path = (folder / res).resolve()
        if path.is_dir():
            objects += kustomize(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch in kust.get("patches") or []:
        target = patch["target"]
        ops = yaml.safe_load((folder / patch["path"]).read_text())
        matched = [o for o in objects if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]]
        if len(matched) != 1:
            raise ValueError(f"{folder}: patch {patch['path']} matches {len(matched)} objects")
        _json_patch(matched[0], ops)
    for group in kust.get("labels") or []:
        for o in objects:
            o["metadata"].setdefault("labels", {}).update(group["pairs"])
    return objects


# ---- the kubelet's part -------------------------------------------------------------------


def project_secret(data: dict[str, str], folder: Path) -> None:
    """Write a Secret's data the way the kubelet fills a Secret volume: files in a timestamped
    folder, ``..data`` pointing at it (swapped by a rename), one symlink per key through
    ``..data``. KEDA's certificate watcher reloads on the creation of ``..data``."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{secrets.token_hex(4)}"
    stamp.mkdir()
    for key, value in data.items():
        (stamp / key).write_bytes(base64.b64decode(value))
        (stamp / key).chmod(0o644)  # defaultMode 420 in KEDA's manifests
    tmp = folder / "..data_tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(stamp.name, tmp)
    os.replace(tmp, folder / "..data")
    for key in data:
        link = folder / key
        if not link.is_symlink():
            os.symlink(f"..data/{key}", link)


def free_port_on(address: str) -> int:
    """A TCP port on ``address`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Ports:
    grpc: int  # operator: the metrics service the metrics server calls (Service port 9666)
    operator_metrics: int  # operator: Prometheus metrics (Service port 8080)
    operator_probe: int  # operator: /healthz, /readyz
    secure: int  # metrics server: the aggregated API (Service port 443)
    server_metrics: int  # metrics server: Prometheus metrics (Service port 8080)


class Keda:
    """KEDA's operator and metrics API server for a :class:`control_plane.ControlPlane`.

    ``bin_dir`` holds ``keda-operator``, ``keda-metrics-apiserver`` and ``keda-config`` (see
    ``build-keda.sh``). ``token_audiences`` is the operator's
    ``KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES`` (entries ``{namespace, serviceAccountName,
    audience}``): KEDA >= 2.21 mints bound service-account tokens only for accounts listed
    there; :meth:`set_token_audiences` changes it later (restarting the operator, as a
    ``helm upgrade`` of KEDA's values would roll its pod).
    """

    def __init__(self, workdir: Path, bin_dir: Path, control_plane: Any, address: str = ADDRESS,
                 token_audiences: Iterable[dict] = (), http_timeout_ms: int = 3000):
        self.workdir = Path(workdir)
        self.bin_dir = Path(bin_dir)
        self.config_dir = self.bin_dir / "keda-config"
        self.control_plane = control_plane
        self.address = address
        self.token_audiences = [dict(e) for e in token_audiences]
        self.http_timeout_ms = http_timeout_ms
        self.api = KubeApi(control_plane.server, control_plane.token, control_plane.ca_file)
        self.cert_dir = self.workdir / "certs"  # the Secret volume both pods mount at /certs
        self.kubeconfig = self.workdir / "keda-operator.kubeconfig"
        self.logs = self.workdir / "logs"
        self.timings: dict[str, float] = {}
        self.ports: Ports | None = None
        self.crd_names: list[str] = []
        self.operator: Daemon | None = None
        self.metrics_server: Daemon | None = None
        self._daemons: list[Daemon] = []
        self.attached = False
        self._running_audiences: list[dict] = []

    # ---- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> "Keda":
        """Install, start both processes, and return once the operator is ready (its /readyz,
        and its metrics service completes a mutual-TLS handshake with KEDA's certificate) and
        ``GET /apis/external.metrics.k8s.io/v1beta1`` answers 200 through the API server.
        Stops what it started on failure."""
        with starting(self) as mark:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.ports = Ports(
                grpc=free_port_on(self.address), operator_metrics=free_port_on(self.address),
                operator_probe=free_port(), secure=free_port_on(self.address),
                server_metrics=free_port_on(self.address),
            )
            self._install(timeout)
            mark("install")
            self._write_kubeconfig()
            self._bootstrap_certificates(timeout)
            mark("certificates")
            self._start_operator(timeout)
            mark("operator")
            self._start_metrics_server(timeout)
        return self

    def stop(self) -> None:
        """Stop every process, newest first (idempotent). The cluster objects stay: the
        control plane goes away with the stage."""
        for daemon in reversed(self._daemons):
            daemon.stop(timeout=15)

    def restart(self, down: float = 0.0, timeout: float = 180.0) -> float:
        """Both processes stopped, left down for ``down`` seconds, then started again with the
        same flags, as a rollout or a crash of KEDA's two Deployments would; returns once both
        serve again, with the moment (``time.time()``) both had exited. Only the process that
        started them can."""
        if self.attached or self.operator is None or self.metrics_server is None:
            raise RuntimeError("KEDA runs in another process: only that process can restart it")
        for daemon in (self.metrics_server, self.operator):
            daemon.stop(timeout=15)
            self._daemons.remove(daemon)
        exited = time.time()
        time.sleep(down)
        self._start_operator(timeout)
        self._start_metrics_server(timeout)
        return exited

    @classmethod
    def attach(cls, workdir: Path, bin_dir: Path, control_plane: Any, address: str, token_audiences: Iterable[dict],
               http_timeout_ms: int, ports: Ports, crd_names: list[str]) -> "Keda":
        """The KEDA another process started (and stops) with these arguments: its API, ports and
        logs, without its processes."""
        keda = cls(workdir, bin_dir, control_plane, address, token_audiences, http_timeout_ms)
        keda.ports, keda.crd_names, keda.attached = ports, list(crd_names), True
        keda.operator = Daemon(OPERATOR, [], {}, keda.logs / f"{OPERATOR}.log")
        keda.metrics_server = Daemon(METRICS_SERVER, [], {}, keda.logs / f"{METRICS_SERVER}.log")
        keda._daemons = [keda.operator, keda.metrics_server]
        keda._running_audiences = list(keda.token_audiences)
        return keda

    def set_token_audiences(self, entries: Iterable[dict], timeout: float = 120.0) -> None:
        """Replace ``KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES`` and restart the operator with it,
        unless the operator already runs with every entry: then nothing changes for it (the
        entries it has besides are other accounts'), and nothing is restarted under scenarios
        that run at the same time."""
        self.token_audiences = [dict(e) for e in entries]
        if all(e in self._running_audiences for e in self.token_audiences):
            return
        if self.attached:
            raise RuntimeError(f"KEDA runs in another process with {self._running_audiences}: it cannot be "
                               f"restarted from here for {self.token_audiences}")
        if self.operator is not None:
            self.operator.stop(timeout=15)
            self._start_operator(timeout)

    def tails(self, lines: int = 40) -> str:
        """The last log lines of each process, for failure messages."""
        return "\n".join(f"---- {d.name} ({d.log_file}):\n{d.tail(lines)}" for d in self._daemons)

    def operator_lines(self, containing: str, lines: int = 15) -> str:
        """The operator's last log lines that mention ``containing`` (e.g. a ScaledObject's name),
        for failure messages."""
        if self.operator is None or not self.operator.log_file.exists():
            return ""
        matching = [line for line in self.operator.log_file.read_text(errors="replace").splitlines()
                    if containing in line]
        return "\n".join(matching[-lines:])

    # ---- what the manifests install ----------------------------------------------------

    def _install(self, timeout: float) -> None:
        version = _keda_version()
        objects = kustomize(self.config_dir / "default", INSTALL_PARTS)
        crds, others = [], []
        for obj in objects:
            if obj["kind"] == "Deployment":
                continue  # the processes below
            # What the release manifest carries (the LabelTransformer of config/default).
            obj["metadata"].setdefault("labels", {}).update(
                {"app.kubernetes.io/version": version, "app.kubernetes.io/part-of": "keda-operator"})
            if obj["kind"] == "Service":
                self._route_service(obj)
            (crds if obj["kind"] == "CustomResourceDefinition" else others).append(obj)
        # The namespace first, the CRDs next (nothing else depends on them), then the rest.
        others.sort(key=lambda o: o["kind"] != "Namespace")
        for obj in others[:1] + crds + others[1:]:
            self.api.apply(obj)
        for obj in others:
            if obj["kind"] == "Service":
                self.api.apply(self._endpoint_slice(obj))

        def established() -> bool:
            return all(
                condition(self.api.get(object_path(crd)), "Established") == "True" for crd in crds
            )

        wait_for(established, timeout, "KEDA's CRDs to be Established")
        self.crd_names = [crd["metadata"]["name"] for crd in crds]

    def _service_ports(self) -> dict[tuple[str, str], int]:
        p = self.ports
        return {
            (OPERATOR, "metricsservice"): p.grpc,
            (OPERATOR, "metrics"): p.operator_metrics,
            (METRICS_SERVER, "https"): p.secure,
            (METRICS_SERVER, "metrics"): p.server_metrics,
        }

    def _route_service(self, svc: dict) -> None:
        """No pods for a selector to match: drop it (the EndpointSlice controller would manage
        an empty slice) and point each port at the process's port."""
        svc["spec"].pop("selector", None)
        ports = self._service_ports()
        for port in svc["spec"]["ports"]:
            key = (svc["metadata"]["name"], port["name"])
            if key not in ports:
                raise ValueError(f"Service {key[0]} has a port {key[1]} no KEDA process here serves")
            port["targetPort"] = ports[key]

    def _endpoint_slice(self, svc: dict) -> dict:
        name = svc["metadata"]["name"]
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-process",
                "namespace": svc["metadata"]["namespace"],
                "labels": {
                    "kubernetes.io/service-name": name,
                    # Anything but the controllers' names, so that none of them adopts it.
                    "endpointslice.kubernetes.io/managed-by": "astro-agent-tests",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.address], "conditions": {"ready": True, "serving": True}}],
            # The aggregator matches the Service port to the slice port by name.
            "ports": [{"name": p["name"], "port": p["targetPort"], "protocol": "TCP"} for p in svc["spec"]["ports"]],
        }

    def _write_kubeconfig(self) -> None:
        # The operator's pod runs as the keda-operator ServiceAccount; so does the metrics
        # server in the release manifest (config/metrics-server/deployment.yaml).
        write_kubeconfig(self.kubeconfig, self.control_plane.server, self.control_plane.ca_file, OPERATOR,
                         self.api.create_token(NAMESPACE, OPERATOR), namespace=NAMESPACE)

    # ---- processes -------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            # The pods' environment in KEDA's manifests and chart.
            "WATCH_NAMESPACE": "",
            "WATCH_LABEL_SELECTOR": "",
            "WATCH_LABEL_SELECTOR_FOR_TRIGGERAUTH": "",
            "POD_NAME": f"{OPERATOR}-0",
            "POD_NAMESPACE": NAMESPACE,
            "OPERATOR_NAME": OPERATOR,
            # A pod reads it from its service-account mount, which a process does not have.
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
            "KEDA_HTTP_DEFAULT_TIMEOUT": str(self.http_timeout_ms),
            "KEDA_HTTP_MIN_TLS_VERSION": "TLS12",
            "KEDA_SERVICE_MIN_TLS_VERSION": "TLS13",
        }
        if os.environ.get("TMPDIR"):
            env["TMPDIR"] = os.environ["TMPDIR"]
        return env

    def _operator_argv(self) -> list[str]:
        p = self.ports
        return [
            str(self.bin_dir / "keda-operator"),
            f"--kubeconfig={self.kubeconfig}",
            # One replica: no Lease to win first.
            "--leader-elect=false",
            "--zap-log-level=info",
            "--zap-encoder=console",
            "--zap-time-encoding=rfc3339",
            "--enable-cert-rotation=true",
            f"--cert-dir={self.cert_dir}",
            f"--cert-secret-name={CERT_SECRET}",
            f"--operator-service-name={OPERATOR}",
            f"--metrics-server-service-name={METRICS_SERVER}",
            f"--k8s-cluster-domain={CLUSTER_DOMAIN}",
            # No admission webhooks here, hence no ValidatingWebhookConfiguration to patch.
            "--enable-webhook-patching=false",
            f"--metrics-bind-address={self.address}:{p.operator_metrics}",
            f"--health-probe-bind-address=127.0.0.1:{p.operator_probe}",
            f"--metrics-service-bind-address={self.address}:{p.grpc}",
        ]

    def _operator_env(self) -> dict[str, str]:
        env = self._env()
        if self.token_audiences:
            env["KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES"] = json.dumps(self.token_audiences)
        return env

    def _daemon(self, name: str, argv: list[str], env: dict[str, str]) -> Daemon:
        daemon = Daemon(name, argv, env, self.logs / f"{name}.log").start()
        self._daemons.append(daemon)
        return daemon

    def _secret_data(self) -> dict[str, str]:
        secret = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{CERT_SECRET}") or {}
        return secret.get("data") or {}

    def _bootstrap_certificates(self, timeout: float) -> None:
        """The operator's first run: it creates the Secret, fills it and exits (a pod would be
        restarted with the Secret now mounted). Then "mount" it."""
        if "tls.crt" not in self._secret_data():
            first = self._daemon(f"{OPERATOR}-bootstrap", self._operator_argv(), self._operator_env())
            try:
                code = first.wait(timeout)
            except Exception:
                raise StartupError(f"the operator did not exit after creating {CERT_SECRET}:\n{first.tail()}") from None
            if code != 0 or "tls.crt" not in self._secret_data():
                raise StartupError(f"the operator's certificate bootstrap failed (exit {code}):\n{first.tail()}")
        project_secret(self._secret_data(), self.cert_dir)

    def _start_operator(self, timeout: float) -> None:
        self.operator = self._daemon(OPERATOR, self._operator_argv(), self._operator_env())
        self._running_audiences = list(self.token_audiences)
        probe = f"http://127.0.0.1:{self.ports.operator_probe}/readyz"

        def ready() -> bool:
            self.operator.check_alive()
            try:
                with urllib.request.urlopen(probe, timeout=3) as response:
                    if response.status != 200:
                        return False
            except OSError:
                return False
            return self._metrics_service_handshake()

        wait_for(ready, timeout, "KEDA's operator (readyz and its metrics service)", interval=0.5,
                 on_timeout=self.operator.tail)

    def _metrics_service_handshake(self) -> bool:
        """A mutual-TLS handshake with the operator's gRPC metrics service, as the metrics
        server makes it (KEDA's certificate, the Service's DNS name, HTTP/2). The port listens
        before the certificates are loaded; the handshake succeeds only after."""
        ctx = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
        ctx.load_cert_chain(str(self.cert_dir / "tls.crt"), str(self.cert_dir / "tls.key"))
        ctx.set_alpn_protocols(["h2"])
        try:
            with socket.create_connection((self.address, self.ports.grpc), timeout=2) as raw:
                with ctx.wrap_socket(raw, server_hostname=self.grpc_authority):
                    return True
        except (OSError, ssl.SSLError):
            return False

    @property
    def grpc_authority(self) -> str:
        return f"{OPERATOR}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"

    def _start_metrics_server(self, timeout: float) -> None:
        p, certs = self.ports, self.cert_dir
        self.metrics_server = self._daemon(METRICS_SERVER, [
            str(self.bin_dir / "keda-metrics-apiserver"),
            # Its controller-runtime client, its lister client and its delegated authentication
            # (TokenReview, the requestheader CA from kube-system's
            # extension-apiserver-authentication ConfigMap) and authorization
            # (SubjectAccessReview); in a pod all four use the mounted service-account token.
            f"--kubeconfig={self.kubeconfig}",
            f"--lister-kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={self.address}",
            f"--secure-port={p.secure}",
            f"--port={p.server_metrics}",
            f"--client-ca-file={certs / 'ca.crt'}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--cert-dir={certs}",
            f"--metrics-service-address={self.address}:{p.grpc}",
            f"--metrics-service-grpc-authority={self.grpc_authority}",
            "--zap-log-level=info",
            "--zap-encoder=console",
        ], self._env())

        def serving() -> bool:
            self.metrics_server.check_alive()
            self.operator.check_alive()
            status, _ = self.api.request("GET", "/apis/external.metrics.k8s.io/v1beta1")
            return status == 200

        wait_for(serving, timeout, "GET /apis/external.metrics.k8s.io/v1beta1 through the API server",
                 interval=0.5, on_timeout=self.tails)


def _keda_version() -> str:
    """KEDA's version without the v (2.21.0), as its release manifests label objects: the pin
    the build used (tests/chart/pins.env)."""
    pins = Path(__file__).resolve().parents[2] / "chart" / "pins.env"
    for line in pins.read_text().splitlines():
        if line.startswith("KEDA_VERSION="):
            return line.split("=", 1)[1].strip().removeprefix("v")
    raise ValueError(f"no KEDA_VERSION in {pins}")
