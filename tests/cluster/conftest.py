"""The cluster stage: the chart, the agent and the Sentinel on a real Kubernetes control plane.

Run it with ``tests/run.sh cluster`` (or ``tests/cluster/run.sh [pytest args]``): that script
builds what is missing and enters the private network and mount namespace these fixtures
expect (``ASTRO_CLUSTER_BIN``, ``ASTRO_CLUSTER_WORK``, ``ASTRO_HELM``, ``ASTRO_AGENT_BIN``,
``ASTRO_SENTINEL_BIN`` set; 10.200.0.1 on ``lo``; a writable hosts file over /etc/hosts).

The scenarios run side by side (pytest-xdist), each in its own namespace and release: with
``ASTRO_CLUSTER_STATE`` set, the shared infrastructure below was started once by
``infra/driver.py`` and every pytest process attaches to it; without it (a file run alone) these
fixtures start their own. Each test file runs in one process, in the order of ``FIRST`` (the
longest first) and then by name; files that share cluster-wide state run in one process, one
after the other (``TOGETHER``). Scenarios marked ``alone`` (they stop the API server or KEDA,
which every scenario shares) run one after another on an instance of the infrastructure of their
own, at the same time as the others (``run.sh``).

Session fixtures (in ``infra/stage.py``), each stopped by PID at the end (also on failure) by
whoever started it:
* ``control_plane``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler;
* ``cluster``: :class:`infra.kube.Cluster` (the official client, admin identity);
* ``nodes``: two large general Nodes, and two 2-CPU Nodes for each namespace of
  ``stage.DEDICATED`` (:func:`dedicated_nodes`), run by the kubelet stand-in;
* ``keda``: KEDA's operator and metrics API server, with its CRDs and APIService;
* ``airflow``: a real Airflow 3 on PostgreSQL, its api-server on 10.200.0.1 so pods reach it,
  with this stage's DAGs;
* ``release_factory``: ``release_factory(name, namespace) -> HelmRelease``; every release it
  made is uninstalled when the test file that made it ends.

A run on the shared infrastructure ends with a stage-wide check (``pytest_sessionfinish``,
``infra/idle_pools.py``): KEDA never read a backlog above 0 for a queue on which no task was
ever queued.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from harness.xdist_units import unit_scheduler
from infra import stage
from infra.helm_release import HelmRelease
from infra.kube import Cluster
from infra.stage import dedicated_nodes  # noqa: F401  (for the scenarios)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# Test files that run first, longest first: the stage lasts as long as its longest process.
FIRST = ("test_hpa_path.py", "test_keda_scaling.py", "test_pre_warm.py", "test_scale_in_idle_first.py",
         "test_pool_alerts.py", "test_chaos_upgrade.py", "test_chaos_slow_airflow.py", "test_chaos_drain.py")
# Test files that share cluster-wide state, by the name of what they share: the HPA path's stacks
# register the one custom.metrics.k8s.io APIService.
TOGETHER = {"test_hpa_path.py": "custom-metrics-apiservice", "test_hpa_stack.py": "custom-metrics-apiservice"}


def _env_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set: run the stage with tests/cluster/run.sh", returncode=2)
    return Path(value)


WORK = _env_path("ASTRO_CLUSTER_WORK")
BIN = _env_path("ASTRO_CLUSTER_BIN")
STATE = os.environ.get("ASTRO_CLUSTER_STATE")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "alone: breaks what every scenario shares (the API server, KEDA); run.sh runs these one "
                   "after another on infrastructure of their own")


def pytest_collection_modifyitems(config, items):
    """Longest files first (the processes take files in this order)."""
    def order(item) -> tuple:
        name = item.path.name
        return (FIRST.index(name) if name in FIRST else len(FIRST), name)

    items.sort(key=order)  # stable: a file's tests keep their order


def pytest_xdist_make_scheduler(config, log):
    """xdist's loadfile (every test of a file in one process: its module fixtures install one
    release), with the files of ``TOGETHER`` as one; and a process gets its next file only when it
    is down to the last test of the one it has (which it runs once it knows what comes next), not
    with two left: else the longest file's process takes a second file at the start and the
    stage lasts both."""
    if config.getvalue("dist") != "loadfile":
        return None

    def file_of(nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return TOGETHER.get(path.rsplit("/", 1)[-1], path)

    return unit_scheduler(config, log, file_of)


def pytest_sessionfinish(session, exitstatus):
    """The stage-wide check, in the process that ran the stage on the shared infrastructure: KEDA
    never read a backlog above 0 for a queue on which no task was ever queued (infra/idle_pools.py)."""
    if not STATE or hasattr(session.config, "workerinput"):
        return
    from infra import idle_pools

    false_non_zero, undetermined = idle_pools.violations(WORK, lambda queue: _attached().airflow.client.count(queue))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in undetermined:
        reporter.write_line(f"idle-pool check, not decided: {line}")
    if false_non_zero:
        reporter.write_sep("=", "KEDA read a backlog above 0 for an idle queue", red=True)
        for line in false_non_zero:
            reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@functools.cache
def _attached() -> stage.Attached:
    return stage.attach(Path(STATE))


@pytest.fixture(scope="session")
def control_plane():
    if STATE:
        yield _attached().control_plane
        return
    cp = None
    try:
        cp = stage.start_control_plane(WORK, BIN)
        yield cp
    finally:
        if cp is not None:
            cp.stop()


@pytest.fixture(scope="session")
def cluster(control_plane) -> Cluster:
    return Cluster(control_plane.server, str(control_plane.ca_file), control_plane.token)


@pytest.fixture(scope="session")
def service_hosts(control_plane):
    """Cluster DNS's stand-in: keeps /etc/hosts (a private copy) mapping Services to endpoints."""
    if STATE:
        yield None
        return
    daemon = stage.start_service_hosts(WORK, control_plane)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def nodes(control_plane, cluster, service_hosts):
    """The kubelet stand-in running the general and dedicated Nodes, all Ready."""
    if STATE:
        yield None
        return
    daemon = stage.start_nodes(WORK, control_plane, cluster)
    try:
        yield daemon
    finally:
        daemon.stop(timeout=60)


@pytest.fixture(scope="session")
def keda(control_plane, service_hosts):
    if STATE:
        yield _attached().keda
        return
    k = None
    try:
        k = stage.start_keda(WORK, BIN, control_plane)
        yield k
    finally:
        if k is not None:
            k.stop()


@pytest.fixture(scope="session")
def airflow():
    """Airflow with the e2e DAG building blocks and this stage's DAGs, reachable from pods."""
    if STATE:
        yield _attached().airflow
        return
    stack = None
    try:
        stack = stage.start_airflow(WORK)
        yield stack
    finally:
        if stack is not None:
            stack.stop()


# Every release's namespace enforces the `restricted` Pod Security Standard (the API server's
# PodSecurity admission): a Pod the chart renders that needs more is refused at creation.
POD_SECURITY = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")}


@pytest.fixture(scope="module")
def release_factory(control_plane, cluster, keda):
    # Per test file: a file's releases are uninstalled when it ends, so that the Sentinels and
    # agents of finished scenarios stop polling the Airflow every scenario shares (left running
    # until the session's end, ten of them held its api-server busy). Depends on KEDA so that
    # releases are uninstalled while KEDA's operator still runs: it removes the finalizers it put
    # on their ScaledObjects.
    made: list[HelmRelease] = []

    def make(name: str, namespace: str) -> HelmRelease:
        cluster.label_namespace(namespace, POD_SECURITY)
        release = HelmRelease(control_plane.kubeconfig, name, namespace, WORK / "helm" / name)
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


def chart_values(airflow, **sentinel) -> dict:
    """The values every release of this stage shares: Airflow's addresses and credentials as
    a user would give them, and pods whose tasks container runs the test Airflow's Python (the
    stand-in's image ``airflow``, see ``stage.start_nodes``)."""
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
            "env": [
                {"name": "ASTRO_AGENT_HEARTBEAT_INTERVAL", "value": "5s"},
                {"name": "ASTRO_AGENT_IDLE_FETCH_INTERVAL", "value": "1s"},
            ],
            # The tasks' "image" is this machine: the task host finds Airflow's task SDK in the
            # test Airflow's venv and the DAGs here.
            "tasks": {
                "python": str(airflow.python),
                "env": [
                    {"name": "AIRFLOW__CORE__DAGS_FOLDER", "value": str(airflow.dags_folder)},
                    {"name": "AIRFLOW_HOME", "value": "/tmp/airflow-home"},
                ],
                # Small, so that the workers' `resources` alone size a Pod, as the scenarios that
                # fill their Nodes expect.
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
            },
            "logFolder": str(WORK / "pod-logs"),
            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
            "readinessProbe": {"initialDelaySeconds": 0, "periodSeconds": 2},
            "livenessProbe": {"initialDelaySeconds": 5, "periodSeconds": 5},
        },
    }
