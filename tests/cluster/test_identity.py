"""Scenario 5: identity. With `keda.auth.mode: boundServiceAccountToken`, KEDA's operator mints a
short-lived token for the chart's permission-less ServiceAccount, and the Sentinel's TokenReview
against this API server accepts it: the ScaledObject is READY and a queued task wakes the pool
0 → 1. A token for another ServiceAccount is refused with 403; one for the right account but
not the Sentinel's audience with 401."""

from __future__ import annotations

import requests
from kubernetes import client

from harness.procs import wait_for

from conftest import chart_values
from infra.kube import condition

NAMESPACE = "astro-bound"
DEPLOYMENT = "astro-worker-bound"
SENTINEL = f"http://astro-sentinel.{NAMESPACE}.svc:39092"
# What the chart names KEDA's identity for a release in NAMESPACE (the KEDA fixture maps it to
# the Sentinel's audience in KEDA_SERVICE_ACCOUNT_TOKEN_AUDIENCES, as NOTES.txt tells users to).
KEDA_IDENTITY = f"astro-{NAMESPACE}-keda-sentinel"
AUDIENCE = "astro-sentinel"


def _token(cluster, namespace: str, service_account: str, audience: str | None) -> str:
    spec = client.V1TokenRequestSpec(audiences=[audience] if audience else [], expiration_seconds=600)
    request = cluster.core.create_namespaced_service_account_token(
        service_account, namespace, client.AuthenticationV1TokenRequest(spec=spec))
    return request.status.token


def _status(token: str) -> int:
    return requests.get(f"{SENTINEL}/v1/workers/{DEPLOYMENT}", headers={"Authorization": f"Bearer {token}"},
                        timeout=5).status_code


def test_keda_bound_token_is_accepted_and_other_identities_are_not(cluster, nodes, keda, airflow, release_factory):
    release = release_factory("bound", NAMESPACE)
    values = chart_values(airflow)
    values["keda"] = {"auth": {"mode": "boundServiceAccountToken"}}
    values["workers"] = [{
        "name": "bound", "queues": ["cluster-bound"], "syncSlots": 2,
        "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 1,
                 "pollingInterval": 2, "cooldownPeriod": 10},
    }]
    release.install(values)
    wait_for(lambda: (cluster.deployment(NAMESPACE, "astro-sentinel").status.ready_replicas or 0) == 1, 90,
             "the Sentinel Ready")
    wait_for(lambda: condition(cluster.scaled_object(NAMESPACE, DEPLOYMENT), "Ready") == "True", 120,
             "ScaledObject READY True with KEDA's bound token",
             on_timeout=lambda: str(cluster.scaled_object(NAMESPACE, DEPLOYMENT).get("status")))
    wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 0, 120, "the pool at 0")

    # KEDA reads the backlog with its own minted token: a queued task wakes the pool.
    airflow.client.ensure_runnable("cluster_wake")
    run_id = airflow.client.trigger("cluster_wake")
    wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 1, 120,
             "KEDA to activate the pool 0 → 1")
    assert airflow.client.wait_run("cluster_wake", run_id, timeout=180) == "success"

    # The same identity, minted by the test: accepted. Others: refused.
    assert _status(_token(cluster, "keda", KEDA_IDENTITY, AUDIENCE)) == 200
    cluster.core.create_namespaced_service_account(NAMESPACE, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="intruder")))
    assert _status(_token(cluster, NAMESPACE, "intruder", AUDIENCE)) == 403
    assert _status(_token(cluster, "keda", KEDA_IDENTITY, None)) == 401
    assert _status("not-a-token") == 401
    wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 0, 120,
             "the pool back at 0 after the cooldown")
    cluster.core.delete_namespaced_service_account("intruder", NAMESPACE)
    release.uninstall()
