"""The cluster stage: the chart, the agent and the Sentinel on a real Kubernetes control plane.

Run it with ``tests/run.sh cluster`` (or ``tests/cluster/run.sh [pytest args]``): that script
builds what is missing and enters the private network and mount namespace these fixtures
expect (``ASTRO_CLUSTER_BIN``, ``ASTRO_CLUSTER_WORK``, ``ASTRO_HELM``, ``ASTRO_AGENT_BIN``,
``ASTRO_SENTINEL_BIN`` set; 10.200.0.1 on ``lo``; a writable hosts file over /etc/hosts).

Session fixtures, each stopped by PID at the end (also on failure):
* ``control_plane``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler;
* ``cluster``: :class:`kube.Cluster` (the official client, admin identity);
* ``nodes``: two Nodes (2 CPUs, 8 GiB, 30 pods each) run by the kubelet stand-in;
* ``keda``: KEDA's operator and metrics API server, with its CRDs and APIService;
* ``airflow``: a real Airflow 3 on PostgreSQL, its api-server on 10.200.0.1 so pods reach it,
  with this stage's DAGs;
* ``release_factory``: ``release_factory(name, namespace) -> HelmRelease``; every release it
  made is uninstalled at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from harness.airflow_stack import AirflowStack
from harness.procs import Daemon, wait_for

from control_plane import ADDRESS, ControlPlane
from helm_release import HelmRelease
from keda_components import Keda
from kube import Cluster

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

NODES = ("node-a", "node-b")
NODE_CPU = "2"
NODE_MEMORY = "8Gi"


def _env_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set: run the stage with tests/cluster/run.sh", returncode=2)
    return Path(value)


WORK = _env_path("ASTRO_CLUSTER_WORK")
BIN = _env_path("ASTRO_CLUSTER_BIN")


def pytest_configure(config):
    # SIGTERM (e.g. a CI timeout) should tear everything down like Ctrl-C does.
    def _raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise_interrupt)


@pytest.fixture(scope="session")
def control_plane():
    cp = ControlPlane(WORK / "control-plane", BIN)
    try:
        cp.start()
        print(f"\ncontrol plane up in {cp.timings['total']:.1f}s (API server ready after {cp.timings['apiserver']:.1f}s)")
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def cluster(control_plane) -> Cluster:
    return Cluster(control_plane.server, str(control_plane.ca_file), control_plane.token)


@pytest.fixture(scope="session")
def service_hosts(control_plane):
    """Cluster DNS's stand-in: keeps /etc/hosts (a private copy) mapping Services to endpoints."""
    daemon = Daemon(
        "service-hosts",
        [sys.executable, str(HERE / "service_hosts.py"), "--kubeconfig", str(control_plane.kubeconfig),
         "--hosts-file", "/etc/hosts"],
        dict(os.environ), WORK / "logs" / "service-hosts.log",
    ).start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def nodes(control_plane, cluster, service_hosts):
    """The kubelet stand-in running two Nodes; waits until both are Ready."""
    args = [sys.executable, str(HERE / "node_standin.py"), "--kubeconfig", str(control_plane.kubeconfig),
            "--workdir", str(WORK / "nodes"), "--cpu", NODE_CPU, "--memory", NODE_MEMORY, "--pods", "30",
            "--image", f"astro-agent={os.environ['ASTRO_AGENT_BIN']}",
            "--image", f"astro-sentinel={os.environ['ASTRO_SENTINEL_BIN']}"]
    for node in NODES:
        args += ["--node", node]
    daemon = Daemon("node-standin", args, dict(os.environ), WORK / "logs" / "node-standin.log").start()
    try:
        def ready() -> bool:
            daemon.check_alive()
            items = cluster.core.list_node().items
            return len(items) == len(NODES) and all(
                any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []) for n in items
            )

        wait_for(ready, 60, "both Nodes Ready", on_timeout=daemon.tail)
        yield daemon
    finally:
        daemon.stop(timeout=60)


@pytest.fixture(scope="session")
def keda(control_plane, service_hosts):
    # What NOTES.txt tells users to give KEDA's operator for the identity scenario's release
    # (test_identity.py): KEDA >= 2.21 mints bound tokens only for audiences listed here.
    bound_identity = {"namespace": "keda", "serviceAccountName": "astro-astro-bound-keda-sentinel",
                      "audience": "astro-sentinel"}
    k = Keda(WORK / "keda", BIN, control_plane, token_audiences=[bound_identity])
    try:
        k.start()
        yield k
    finally:
        k.stop()


@pytest.fixture(scope="session")
def airflow():
    """Airflow with the e2e DAG building blocks and this stage's DAGs, reachable from pods."""
    dags = WORK / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    e2e_dags = ROOT / "tests" / "e2e" / "dags"
    for name in ("astro_e2e_tasks.py", ".airflowignore"):
        shutil.copy(e2e_dags / name, dags / name)
    for dag in (HERE / "dags").glob("*.py"):
        shutil.copy(dag, dags / dag.name)
    stack = AirflowStack(dags_folder=dags, host=ADDRESS)
    try:
        stack.start()
        print(f"\nAirflow up in {stack.timings['total']:.1f}s at {stack.api_base}")
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def release_factory(control_plane, keda):
    # Depends on KEDA so that releases are uninstalled while KEDA's operator still runs: it
    # removes the finalizers it put on their ScaledObjects.
    made: list[HelmRelease] = []

    def make(name: str, namespace: str) -> HelmRelease:
        release = HelmRelease(Path(os.environ["ASTRO_HELM"]), control_plane.kubeconfig, name, namespace, WORK / "helm")
        made.append(release)
        return release

    yield make
    for release in made:
        if not release.installed:
            continue
        try:
            release.uninstall()
        except Exception as e:  # the cluster is half-down: report, and go on with the others
            print(f"uninstall {release.name}: {e}")


def chart_values(airflow: AirflowStack, **sentinel) -> dict:
    """The values every release of this stage shares: Airflow's addresses and credentials as
    a user would give them, and pods that run the agent with the test Airflow's Python."""
    from harness.airflow_stack import PASSWORD, USERNAME

    return {
        "airflow": {
            "edgeApiUrl": {"value": airflow.edge_api_url},
            "executionApiUrl": {"value": airflow.execution_api_url},
            "jwtSecret": {"value": airflow.jwt_secret},
            "restApi": {
                "url": airflow.api_base,
                "username": {"value": USERNAME},
                "password": {"value": PASSWORD},
            },
        },
        "sentinel": {"enabled": True, "refreshInterval": "1s", **sentinel},
        "workerDefaults": {
            # The "image" is this machine: the agent finds Airflow's task SDK and the DAGs here.
            "env": [
                {"name": "ASTRO_AGENT_PYTHON", "value": str(airflow.python)},
                {"name": "AIRFLOW__CORE__DAGS_FOLDER", "value": str(airflow.dags_folder)},
                {"name": "AIRFLOW_HOME", "value": "/tmp/airflow-home"},
                {"name": "ASTRO_AGENT_HEARTBEAT_INTERVAL", "value": "5s"},
                {"name": "ASTRO_AGENT_IDLE_FETCH_INTERVAL", "value": "1s"},
            ],
            "logFolder": str(WORK / "pod-logs"),
            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
            "readinessProbe": {"initialDelaySeconds": 0, "periodSeconds": 2},
            "livenessProbe": {"initialDelaySeconds": 5, "periodSeconds": 5},
        },
    }
