"""A real Kubernetes control plane for the cluster stage: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, built from the Go module proxy (``build.sh``).

It must run inside the stage's private network namespace (``run.sh``), where ``ADDRESS`` sits on
``lo``: the API server refuses loopback addresses in Endpoints, and the aggregation layer
(external.metrics.k8s.io for KEDA, custom.metrics.k8s.io for prometheus-adapter) and Services
route to endpoint addresses, so everything that serves the cluster listens on ``ADDRESS``.

What a kubeadm cluster has and this one has too: RBAC and Node authorization, service-account
tokens signed by the API server, the front proxy the aggregation layer authenticates with, the
controllers running with one service-account identity each (so the HPA controller needs the
same RBAC to read external and custom metrics as in a real cluster), and a scheduler. What it
leaves out: kube-proxy and cluster DNS (see ``service_hosts.py``), and the kubelet (see
``standin/``). Clients authenticate with a static admin token (system:masters).
"""

from __future__ import annotations

import os
import secrets
import ssl
import time
import urllib.request
from pathlib import Path

from harness import certs
from harness.procs import Daemon, StartupError, free_port, starting, wait_for

from infra.kube_api import write_kubeconfig

ADDRESS = "10.200.0.1"
API_PORT = 6443
SERVICE_CIDR = "10.96.0.0/24"
# The first address of the service range: the ClusterIP of the `kubernetes` Service.
KUBERNETES_SERVICE_IP = "10.96.0.1"
FRONT_PROXY_CLIENT = "front-proxy-client"
# The HPA controller's sync period (15 s by default); shorter so the scenarios take less time.
HPA_SYNC_PERIOD = "5s"


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler, stopped by PID.

    Attributes (valid after :meth:`start`): ``server`` (https URL), ``token`` (admin bearer
    token), ``kubeconfig`` (admin kubeconfig file), ``ca_file`` (the cluster CA, which signed
    the API server's certificate), ``front_proxy_ca`` / ``front_proxy_client`` (what extension
    API servers trust / the aggregator presents), ``address``.
    """

    def __init__(self, workdir: Path, bin_dir: Path, address: str = ADDRESS):
        self.workdir = Path(workdir)
        self.bin_dir = Path(bin_dir)
        self.address = address
        self.server = f"https://{address}:{API_PORT}"
        self.token = secrets.token_urlsafe(32)
        self.pki = self.workdir / "pki"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.ca_file = self.pki / "ca.crt"
        self.timings: dict[str, float] = {}
        self._daemons: list[Daemon] = []

    # ---- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 120.0, controllers: bool = True) -> "ControlPlane":
        """Start everything (only etcd and the API server without ``controllers``: objects are
        stored, nothing acts on them); return once the API server is ready and the controllers
        and the scheduler answer their health checks. Stops what it started on failure."""
        with starting(self) as mark:
            self._make_pki()
            self._write_kubeconfig()
            etcd_url = self._start_etcd(timeout)
            self._start_apiserver(etcd_url, timeout)
            mark("apiserver")
            if controllers:
                self._start_controller_manager(timeout)
                self._start_scheduler(timeout)
        return self

    def stop(self) -> None:
        """Stop every process, newest first (idempotent)."""
        for daemon in reversed(self._daemons):
            daemon.stop(timeout=15)

    def restart_apiserver(self, down: float, timeout: float = 120.0) -> float:
        """The API server stopped (SIGTERM, as a crash or an upgrade of the control plane would
        take it away), left down for ``down`` seconds -- the outage itself -- and started again
        with the same flags; returns once it is ready, with the moment (``time.time()``) its
        process had exited: until then it served the watches it had. etcd keeps every object
        meanwhile."""
        apiserver = self.daemon("kube-apiserver")
        apiserver.stop(timeout=15)
        exited = time.time()
        time.sleep(down)
        apiserver.start()
        self._wait_http(apiserver, f"{self.server}/readyz", timeout)
        return exited

    def daemon(self, name: str) -> Daemon:
        """The running ``etcd``, ``kube-apiserver``, ``kube-controller-manager`` or
        ``kube-scheduler`` (PID, log file)."""
        return next(d for d in self._daemons if d.name == name)

    # ---- set-up ----------------------------------------------------------------------

    def _make_pki(self) -> None:
        ca = certs.make_ca(self.pki, "ca")
        certs.issue(
            ca, self.pki, "apiserver", "kube-apiserver",
            ips=(self.address, KUBERNETES_SERVICE_IP, "127.0.0.1"),
            dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local", "localhost"),
        )
        front = certs.make_ca(self.pki, "front-proxy-ca")
        self.front_proxy_ca = front.cert
        self.front_proxy_client = certs.issue(front, self.pki, FRONT_PROXY_CLIENT, FRONT_PROXY_CLIENT, client=True)
        self.sa_key, self.sa_pub = certs.make_rsa_key_pair(self.pki, "sa")
        # user,uid,"group": system:masters is what kubeadm's admin.conf carries.
        (self.pki / "tokens.csv").write_text(f'{self.token},admin,admin,"system:masters"\n')

    def _write_kubeconfig(self) -> None:
        write_kubeconfig(self.kubeconfig, self.server, self.ca_file, "admin", self.token)

    def _daemon(self, name: str, argv: list[str]) -> Daemon:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir)}
        daemon = Daemon(name, argv, env, self.workdir / "logs" / f"{name}.log").start()
        self._daemons.append(daemon)
        return daemon

    def _start_etcd(self, timeout: float) -> str:
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        etcd = self._daemon("etcd", [
            str(self.bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            # A throw-away cluster: durability buys nothing and fsyncs cost seconds on a busy disk.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ])
        self._wait_http(etcd, f"{url}/health", timeout, insecure=True)
        return url

    def _start_apiserver(self, etcd_url: str, timeout: float) -> None:
        pki = self.pki
        apiserver = self._daemon("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--advertise-address={self.address}",
            f"--bind-address={self.address}",
            f"--secure-port={API_PORT}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The aggregation layer: the API server proxies external.metrics.k8s.io and
            # custom.metrics.k8s.io to their servers (at their endpoint addresses, since there
            # is no kube-proxy), presenting the front-proxy client certificate; they trust
            # the front-proxy CA for the X-Remote-* headers.
            "--enable-aggregator-routing=true",
            f"--requestheader-client-ca-file={self.front_proxy_ca}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_client.cert}",
            f"--proxy-client-key-file={self.front_proxy_client.key}",
            "--allow-privileged=true",
            "--profiling=false",
        ])
        self._wait_http(apiserver, f"{self.server}/readyz", timeout)

    def _component_flags(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
        ]

    def _start_controller_manager(self, timeout: float) -> None:
        port = free_port()
        kcm = self._daemon("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            *self._component_flags(),
            f"--secure-port={port}",
            f"--service-account-private-key-file={self.sa_key}",
            f"--root-ca-file={self.ca_file}",
            # Each controller acts as its own service account, as in kubeadm clusters: the HPA
            # controller then needs the RBAC to read metrics that KEDA's and the adapter's
            # installs grant it.
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
        ])
        self._wait_http(kcm, f"https://127.0.0.1:{port}/healthz", timeout, insecure=True)

    def _start_scheduler(self, timeout: float) -> None:
        port = free_port()
        scheduler = self._daemon("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            *self._component_flags(),
            f"--secure-port={port}",
        ])
        self._wait_http(scheduler, f"https://127.0.0.1:{port}/healthz", timeout, insecure=True)

    def _wait_http(self, daemon: Daemon, url: str, timeout: float, insecure: bool = False) -> None:
        if insecure:
            context = ssl._create_unverified_context()  # health checks of self-signed local servers
        else:
            context = ssl.create_default_context(cafile=str(self.ca_file))
        headers = {} if insecure else {"Authorization": f"Bearer {self.token}"}

        def ok() -> bool:
            daemon.check_alive()
            try:
                request = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(request, timeout=3, context=context) as response:
                    return response.status == 200
            except OSError:
                return False

        try:
            wait_for(ok, timeout, f"{daemon.name} at {url}", on_timeout=daemon.tail)
        except TimeoutError as e:
            raise StartupError(str(e)) from None
