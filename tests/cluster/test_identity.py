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
from infra.metrics_sample import sample

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
    # KEDA's identity with the API server's audience is no KEDA token; as a person's token
    # (sentinel.kubernetes.userAccess) it is a real user who may not get the Deployment: 403.
    assert _status(_token(cluster, "keda", KEDA_IDENTITY, None)) == 403
    assert _status("not-a-token") == 401
    wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 0, 120,
             "the pool back at 0 after the cooldown")
    cluster.core.delete_namespaced_service_account("intruder", NAMESPACE)
    release.uninstall()


WAKE_NAMESPACE = "astro-wake"
WAKE_DEPLOYMENT = "astro-worker-wake"
WAKE_SENTINEL = f"http://astro-sentinel.{WAKE_NAMESPACE}.svc:39092"
QUEUE_EVENTS_AUDIENCE = "astro-sentinel-queue-events"  # the chart's sentinel.queueEvents.audience


def _get(path: str, token: str, **kwargs) -> requests.Response:
    return requests.get(f"{WAKE_SENTINEL}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=5, **kwargs)


def _agent_metric(name: str) -> float | None:
    """A sample of the worker Pod's agent's /metrics, through the worker's Service."""
    return sample(f"http://{WAKE_DEPLOYMENT}.{WAKE_NAMESPACE}.svc:39091/metrics", name)


def test_a_worker_pods_token_opens_the_queue_events_only(cluster, nodes, keda, airflow, release_factory):
    """Each worker Pod's agent subscribes to the Sentinel with the token the kubelet projects for
    the queue-event audience (its subscription gauge says so); a token of the workers' account
    for that audience opens the stream and is refused on the backlogs; KEDA's token keeps every
    endpoint it had, and its ScaledObject is READY."""
    release = release_factory("wake", WAKE_NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = [{
        "name": "wake", "queues": ["cluster-subscribe"], "syncSlots": 2,
        "keda": {"enabled": True, "minReplicaCount": 1, "maxReplicaCount": 1, "pollingInterval": 2},
    }]
    release.install(values)
    wait_for(lambda: (cluster.deployment(WAKE_NAMESPACE, "astro-sentinel").status.ready_replicas or 0) == 1, 90,
             "the Sentinel Ready")
    wait_for(lambda: (cluster.deployment(WAKE_NAMESPACE, WAKE_DEPLOYMENT).status.ready_replicas or 0) == 1, 120,
             "the worker Pod Ready")
    # The agent in the Pod holds its subscription with the projected token.
    wait_for(lambda: _agent_metric("astro_agent_sentinel_subscribed") == 1, 60,
             "the worker Pod's agent subscribed to the Sentinel")

    worker_token = _token(cluster, WAKE_NAMESPACE, "default", QUEUE_EVENTS_AUDIENCE)
    with _get("/v1/queues/events?queue=cluster-subscribe", worker_token, stream=True) as stream:
        assert stream.status_code == 200, stream.text
        first = next(stream.iter_lines(decode_unicode=True))
        assert first == "event: subscribed", first
    # KEDA has a static token here, so the readers' rules know no service account at all: 401.
    for path in (f"/v1/workers/{WAKE_DEPLOYMENT}", "/v1/workers", f"/v1/workers/{WAKE_DEPLOYMENT}/history"):
        assert _get(path, worker_token).status_code == 401, path
    # The workers' account with another audience (the API server's own) is nobody here.
    assert _get("/v1/queues/events?queue=cluster-subscribe",
                _token(cluster, WAKE_NAMESPACE, "default", None)).status_code == 401

    keda_token = cluster.secret_value(WAKE_NAMESPACE, "astro-keda-sentinel-token", "token")
    for path in (f"/v1/workers/{WAKE_DEPLOYMENT}", "/v1/workers", f"/v1/workers/{WAKE_DEPLOYMENT}/history"):
        assert _get(path, keda_token).status_code == 200, path
    wait_for(lambda: condition(cluster.scaled_object(WAKE_NAMESPACE, WAKE_DEPLOYMENT), "Ready") == "True", 120,
             "ScaledObject READY True with KEDA's token")
    release.uninstall()
