"""Scenario: the chart's two-container worker Pod on the control plane, hunted by a task.

A worker Pod as the chart renders it — the ``install-agent`` init container, the ``tasks``
native sidecar (the task host as its PID 1) and the ``agent`` container with the credentials —
run by the kubelet stand-in with a PID namespace and a filesystem view per container. The agent
container gets canaries the way users give it secrets: Airflow's JWT secret as the chart's
Secret file, one more in its ``env`` and one through ``envFrom`` from a Secret. Two tasks of the
docker stage's hunting DAG (tests/docker/dags/docker_canary_hunt.py) run at once in the tasks
container and search ``/proc``, open files, command lines, the container's volumes, the chart's
secrets folder and each other's work files. Asserted: both tasks succeeded, their
logs were shipped, they found no canary, read something, and saw no agent process.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from kubernetes import client

from harness.procs import wait_for

from conftest import WORK, chart_values

NAMESPACE = "astro-secrets"
DAG = "docker_canary_hunt"
TASKS = ("hunt_a", "hunt_b")


def test_no_task_in_a_worker_pod_reaches_the_agents_secrets(cluster, nodes, airflow, release_factory):
    canaries = {
        "jwt_secret": airflow.jwt_secret,  # the chart mounts it into the agent container only
        "env": "env-" + secrets.token_urlsafe(32),
        "env_from": "envfrom-" + secrets.token_urlsafe(32),
    }
    # The envFrom Secret exists before the Pod, as a user's would.
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    cluster.core.create_namespaced_secret(NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name="agent-canary"), string_data={"AGENT_CANARY_FROM": canaries["env_from"]}))
    release = release_factory("secrets", NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = [{
        "name": "hunted",
        "queues": ["pod"],
        "syncSlots": 2,
        "replicas": 1,
        "env": values["workerDefaults"]["env"] + [{"name": "AGENT_CANARY", "value": canaries["env"]}],
        "envFrom": [{"secretRef": {"name": "agent-canary"}}],
    }]
    release.install(values, {"sentinel": {"enabled": False}})
    wait_for(lambda: (cluster.deployment(NAMESPACE, "astro-worker-hunted").status.ready_replicas or 0) == 1,
             180, "the worker Pod Ready")

    run = airflow.client.trigger(DAG, conf={
        "reversed_canaries": [c[::-1] for c in canaries.values()],
        "log_folder": str(WORK / "pod-logs"),
        # The tasks container's own files: its volumes. The stand-in runs containers on the host's
        # filesystem, whose other files (this stage's own, Airflow's included) no Pod has.
        "search_folders": ["/opt/astro-agent/bin", "/run/astro-agent", "/tmp"],
    })
    try:
        state = airflow.client.wait_run(DAG, run, timeout=360)
        logs = {t: airflow.client.task_log_text(DAG, run, t) for t in TASKS}
        assert state == "success", "\n".join(f"== {t}\n{log[-4000:]}" for t, log in logs.items())
        for task_id in TASKS:
            assert f"astro-canary-hunt task={task_id} run={run}" in logs[task_id], "shipped by the agent"
            summary = airflow.client.get(
                f"/api/v2/dags/{DAG}/dagRuns/{run}/taskInstances/{task_id}/xcomEntries/return_value",
                deserialize="true", stringify="false",
            )["value"]
            print(f"\n{task_id}: read {len(summary['read'])} paths, refused {len(summary['refused'])}")
            assert summary["found"] == []
            assert summary["read"], "a search that read nothing proves nothing"
            agents = [p for p in summary["processes"]
                      if p.get("argv") and Path(p["argv"][0]).name == "astro-agent" and p["argv"][1:2] != ["task-host"]]
            assert not agents, f"the agent's process is visible to tasks: {agents}"
    finally:
        airflow.abandon_run(DAG, run)
