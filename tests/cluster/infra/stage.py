"""What every cluster scenario shares: the control plane, the Service resolver, the Nodes, KEDA and
Airflow. Each is started here, by the conftest's session fixtures when pytest runs alone, or once
by ``driver.py`` for several pytest processes (pytest-xdist workers), which then attach to it
through the state file the driver writes (:func:`attach`).

Scenarios that run at the same time share the Nodes: most fit on the two general ones, which are
large. A scenario that needs to run out of room (pods Pending, unschedulable) gets two Nodes of its
own, tainted and labelled for its namespace (:data:`DEDICATED`, :func:`dedicated_nodes`), so that
what the others run does not change what fits there.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.airflow_stack import AirflowStack, airflow_venv
from harness.procs import Daemon, wait_for

from infra.control_plane import ADDRESS, ControlPlane
from infra.keda_components import Keda, Ports
from infra.kube import Cluster

CLUSTER_TESTS = Path(__file__).resolve().parents[1]
ROOT = CLUSTER_TESTS.parents[1]

# The general Nodes: room for every scenario that runs at the same time as the others.
GENERAL_NODES = ("node-a", "node-b")
GENERAL_CAPACITY = "cpu=8,memory=32Gi,pods=110"
# Namespaces whose scenarios fill (or drain) their Nodes on purpose: two 2-CPU Nodes each, as a
# small cluster.
DEDICATED = ("astro-scaling", "astro-alerts", "astro-drain")
DEDICATED_CAPACITY = "cpu=2,memory=8Gi,pods=30"
DEDICATED_KEY = "astro.test/dedicated"

# What KEDA's operator may mint bound tokens for (KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES):
# * what NOTES.txt tells users to give KEDA's operator for the identity scenario's release
#   (test_identity.py): KEDA >= 2.21 mints bound tokens only for audiences listed here;
# * the identity test_keda_components.py's bound-token test uses, given from the start so that
#   no scenario restarts the operator another one relies on.
TOKEN_AUDIENCES = (
    {"namespace": "keda", "serviceAccountName": "astro-astro-bound-keda-sentinel", "audience": "astro-sentinel"},
    {"namespace": "keda", "serviceAccountName": "bound-identity", "audience": "backlog-test"},
)


def dedicated_node_names(namespace: str) -> list[str]:
    short = namespace.removeprefix("astro-")
    return [f"{short}-a", f"{short}-b"]


def node_names() -> list[str]:
    return [*GENERAL_NODES, *(n for ns in DEDICATED for n in dedicated_node_names(ns))]


def dedicated_nodes(namespace: str) -> dict[str, Any]:
    """A worker's (or the Sentinel's) nodeSelector and tolerations for the Nodes of ``namespace``."""
    assert namespace in DEDICATED, namespace
    return {"nodeSelector": {DEDICATED_KEY: namespace},
            "tolerations": [{"key": DEDICATED_KEY, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}]}


def start_control_plane(work: Path, bin_dir: Path) -> ControlPlane:
    cp = ControlPlane(work / "control-plane", bin_dir)
    cp.start()
    print(f"\ncontrol plane up in {cp.timings['total']:.1f}s (API server ready after {cp.timings['apiserver']:.1f}s)")
    return cp


def start_service_hosts(work: Path, control_plane: ControlPlane) -> Daemon:
    """Cluster DNS's stand-in: keeps /etc/hosts (a private copy) mapping Services to endpoints."""
    return Daemon(
        "service-hosts",
        [sys.executable, "-m", "infra.service_hosts", "--kubeconfig", str(control_plane.kubeconfig),
         "--hosts-file", "/etc/hosts"],
        _env_with_cluster_tests(), work / "logs" / "service-hosts.log",
    ).start()


def start_nodes(work: Path, control_plane: ControlPlane, cluster: Cluster) -> Daemon:
    """The kubelet stand-in running the general and the dedicated Nodes; waits until all are Ready.

    Images: the agent and the Sentinel are their release binaries; the workers' tasks image
    (``apache/airflow`` by default, matched by its last component) is the test Airflow's venv,
    whose Python runs the tasks (``chart_values`` sets it as ``tasks.python``). The venv is the one
    ``start_airflow`` uses (built once, under a lock, by whichever asks first)."""
    args = [sys.executable, "-m", "standin",
            "--kubeconfig", str(control_plane.kubeconfig), "--workdir", str(work / "nodes"),
            "--image", f"astro-agent={os.environ['ASTRO_AGENT_BIN']}",
            "--image", f"astro-sentinel={os.environ['ASTRO_SENTINEL_BIN']}",
            "--image", f"airflow={airflow_venv() / 'bin' / 'python'}"]
    for node in GENERAL_NODES:
        args += ["--node", f"{node}:{GENERAL_CAPACITY}"]
    for namespace in DEDICATED:
        mark = f"{DEDICATED_KEY}={namespace}"
        for node in dedicated_node_names(namespace):
            args += ["--node", f"{node}:{DEDICATED_CAPACITY},label={mark},taint={mark}:NoSchedule"]
    daemon = Daemon("node-standin", args, _env_with_cluster_tests(), work / "logs" / "node-standin.log").start()
    names = set(node_names())
    try:
        def ready() -> bool:
            daemon.check_alive()
            items = cluster.core.list_node().items
            return {n.metadata.name for n in items} >= names and all(
                any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                for n in items if n.metadata.name in names)

        wait_for(ready, 60, f"Nodes {sorted(names)} Ready", on_timeout=daemon.tail)
    except BaseException:
        daemon.stop(timeout=60)
        raise
    return daemon


def start_keda(work: Path, bin_dir: Path, control_plane: ControlPlane) -> Keda:
    return Keda(work / "keda", bin_dir, control_plane, token_audiences=TOKEN_AUDIENCES).start()


def start_airflow(work: Path) -> AirflowStack:
    """Airflow with the e2e DAG building blocks and this stage's DAGs, reachable from pods."""
    dags = work / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    e2e_dags = ROOT / "tests" / "e2e" / "dags"
    for name in ("astro_e2e_tasks.py", ".airflowignore"):
        shutil.copy(e2e_dags / name, dags / name)
    for dag in (CLUSTER_TESTS / "dags").glob("*.py"):
        shutil.copy(dag, dags / dag.name)
    # The docker stage's hunt for the agent's secrets, run in the chart's worker Pod too.
    hunt = ROOT / "tests" / "docker" / "dags" / "docker_canary_hunt.py"
    shutil.copy(hunt, dags / hunt.name)
    stack = AirflowStack(dags_folder=dags, host=ADDRESS)
    stack.start()
    print(f"\nAirflow up in {stack.timings['total']:.1f}s at {stack.api_base}")
    return stack


def _env_with_cluster_tests() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CLUSTER_TESTS), env.get("PYTHONPATH")]))
    return env


# ---- sharing: what the driver writes, what pytest workers attach to ------------------------------

def state(control_plane: ControlPlane, keda: Keda, airflow: AirflowStack) -> dict[str, Any]:
    return {
        "control_plane": {"workdir": str(control_plane.workdir), "bin_dir": str(control_plane.bin_dir),
                          "address": control_plane.address, "token": control_plane.token},
        "keda": {"workdir": str(keda.workdir), "bin_dir": str(keda.bin_dir), "address": keda.address,
                 "token_audiences": keda.token_audiences, "http_timeout_ms": keda.http_timeout_ms,
                 "ports": vars(keda.ports), "crd_names": keda.crd_names},
        "airflow": airflow.state(),
    }


def write_state(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.chmod(0o600)
    tmp.replace(path)


@dataclass
class Attached:
    control_plane: ControlPlane
    keda: Keda
    airflow: AirflowStack


def attach(path: Path) -> Attached:
    """The shared infrastructure another process started, as described in its state file: the
    same objects the fixtures would have started, whose processes this one neither starts nor stops."""
    value = json.loads(Path(path).read_text())
    cp_state = value["control_plane"]
    cp = ControlPlane(Path(cp_state["workdir"]), Path(cp_state["bin_dir"]), cp_state["address"])
    cp.token = cp_state["token"]
    k = value["keda"]
    keda = Keda.attach(Path(k["workdir"]), Path(k["bin_dir"]), cp, k["address"], k["token_audiences"],
                       k["http_timeout_ms"], Ports(**k["ports"]), k["crd_names"])
    return Attached(cp, keda, AirflowStack.attach(value["airflow"]))
