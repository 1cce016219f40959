"""Anyone who can see the Deployment can open its history (`sentinel.kubernetes.userAccess`):
the real kube-apiserver authenticates a person's token (TokenRequest, its own audience) and its
RBAC decides (the `view` ClusterRole bound in the release's namespace, or in another one)."""

from __future__ import annotations

import requests
from kubernetes import client

from harness.procs import wait_for

from conftest import chart_values

NAMESPACE = "astro-access"
ELSEWHERE = "astro-access-other"
SENTINEL = f"http://astro-sentinel.{NAMESPACE}.svc:39092"
WORKER = "astro-worker-alpha"


def _person_bound_to_view(cluster, name: str, namespace: str) -> str:
    """A service account in ``namespace`` bound to ``view`` there; its token for the API server."""
    cluster.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=name)))
    cluster.rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=f"{name}-view"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="view"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name, namespace=namespace)]))
    # No audiences: the API server's own, what `kubectl create token` gives.
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    return cluster.core.create_namespaced_service_account_token(name, namespace, request).status.token


def test_a_viewer_of_the_namespace_opens_the_history_and_one_elsewhere_is_refused(
        cluster, nodes, keda, airflow, release_factory):
    release = release_factory("access", NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = [{"name": "alpha", "queues": ["cluster-access"], "syncSlots": 2,
                          "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 2}}]
    release.install(values)
    wait_for(lambda: (cluster.deployment(NAMESPACE, "astro-sentinel").status.ready_replicas or 0) == 1,
             90, "the Sentinel pod Ready")
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ELSEWHERE)))
    try:
        alice = _person_bound_to_view(cluster, "alice", NAMESPACE)
        bob = _person_bound_to_view(cluster, "bob", ELSEWHERE)

        def get(path: str, token: str) -> requests.Response:
            return requests.get(f"{SENTINEL}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10)

        history = get(f"/v1/workers/{WORKER}/history?range=15m", alice)
        assert history.status_code == 200, history.text
        assert "recordingSince" in history.json()
        listed = get("/v1/workers", alice)
        assert [w["worker"] for w in listed.json()["workers"]] == [WORKER], listed.text

        refused = get(f"/v1/workers/{WORKER}/history?range=15m", bob)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == (f"user system:serviceaccount:{ELSEWHERE}:bob may not get "
                                          f"Deployment {WORKER} in namespace {NAMESPACE}")
        assert get("/v1/workers", "not-a-token").status_code == 401

        metrics = requests.get(f"{SENTINEL}/metrics", timeout=10).text
        assert 'astro_sentinel_access_reviews_total{kind="access",outcome="answered"}' in metrics
    finally:
        cluster.core.delete_namespace(ELSEWHERE)
