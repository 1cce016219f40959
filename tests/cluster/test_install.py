"""Scenario 1: helm install, upgrade and uninstall of the chart against the real API server, with
KEDA's CRDs and operator: every object admitted, the Sentinel Ready, KEDA READY on each
ScaledObject, an upgrade's syncSlots reaching the ScaledObject and KEDA's HPA, nothing left.

The install gives KEDA's token as a value (the chart renders its Secret), the upgrade drops it, as
an upgrade from a chart version that rendered a generated token does: the pre-upgrade Job
(`astro-sentinel ensure-secrets`) takes the Secret over and Helm must not delete it."""

from __future__ import annotations

from kubernetes import dynamic
from kubernetes.client.rest import ApiException

from harness.procs import wait_for

from conftest import chart_values
from infra.kube import condition

NAMESPACE = "astro-install"
TOKEN_SECRET = "astro-keda-sentinel-token"
TOKEN = "install-scenario-token-0123456789abcdef"


def _workers(sync_slots_alpha: int) -> list[dict]:
    # A short cooldown: should a trigger read active once, the pool is still back at 0 within the
    # test's wait (the chart's default is 300 s).
    keda = {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 3, "pollingInterval": 2, "cooldownPeriod": 5}
    return [
        {"name": "alpha", "queues": ["cluster-install-a"], "syncSlots": sync_slots_alpha, "keda": keda},
        {"name": "beta", "queues": ["cluster-install-b", "cluster-install-c"], "syncSlots": 2, "keda": keda},
    ]


def _live(client: dynamic.DynamicClient, obj: dict) -> dict | None:
    resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    namespace = obj["metadata"].get("namespace", NAMESPACE) if resource.namespaced else None
    try:
        return resource.get(name=obj["metadata"]["name"], namespace=namespace).to_dict()
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _trigger_target(scaled_object: dict) -> str:
    """The target of the metrics-api triggers (the backlog's, and pre-warm's beside it), which
    must agree: both count task slots against syncSlots."""
    targets = {t["metadata"]["targetValue"] for t in scaled_object["spec"]["triggers"] if t["type"] == "metrics-api"}
    (target,) = targets
    return target


def test_install_upgrade_uninstall(cluster, nodes, keda, airflow, release_factory):
    release = release_factory("install", NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = _workers(4)
    values["keda"] = {"auth": {"staticToken": {"value": TOKEN}}}
    release.install(values)
    objects = release.manifest()
    client = dynamic.DynamicClient(cluster.api)

    # Admitted: each object helm rendered is stored by the API server.
    missing = [f"{o['kind']}/{o['metadata']['name']}" for o in objects if _live(client, o) is None]
    assert not missing, f"objects helm rendered but the API server does not have: {missing}"
    kinds = sorted({o["kind"] for o in objects})
    print(f"\ninstalled {len(objects)} objects: {', '.join(kinds)}")
    assert {"Deployment", "Service", "ScaledObject", "TriggerAuthentication"} <= set(kinds)

    (sentinel,) = [o["metadata"]["name"] for o in objects
                   if o["kind"] == "Deployment" and "sentinel" in o["metadata"]["name"]]
    wait_for(lambda: (cluster.deployment(NAMESPACE, sentinel).status.ready_replicas or 0) == 1,
             90, "the Sentinel pod Ready")

    scaled = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "ScaledObject")
    assert scaled == ["astro-worker-alpha", "astro-worker-beta"]
    for name in scaled:
        wait_for(lambda: condition(cluster.scaled_object(NAMESPACE, name), "Ready") == "True",
                 90, f"ScaledObject {name} READY True",
                 on_timeout=lambda: str((cluster.scaled_object(NAMESPACE, name).get("status") or {})))
        # KEDA took the Deployment over: its HPA exists and, with no work queued, the pool is at 0.
        wait_for(lambda: cluster.hpa(NAMESPACE, f"keda-hpa-{name}") is not None, 60, f"keda-hpa-{name}")
        wait_for(lambda: cluster.deployment(NAMESPACE, name).spec.replicas == 0, 120, f"{name} at 0 replicas",
                 on_timeout=lambda: f"ScaledObject status {cluster.scaled_object(NAMESPACE, name).get('status')}; "
                                    f"HPA status {cluster.hpa(NAMESPACE, f'keda-hpa-{name}').status}")

    # Upgrade: a new syncSlots is the ScaledObject's target and the target of the HPA KEDA made.
    # The token value is dropped: the Secret leaves the chart and the pre-upgrade Job keeps it.
    assert any(o["kind"] == "Secret" and o["metadata"]["name"] == TOKEN_SECRET for o in objects)
    values["workers"] = _workers(6)
    del values["keda"]
    release.upgrade(values)
    assert not [o for o in release.manifest() if o["kind"] == "Secret" and o["metadata"]["name"] == TOKEN_SECRET]
    assert cluster.secret_value(NAMESPACE, TOKEN_SECRET, "token") == TOKEN, "the token changed at the upgrade"
    kept = cluster.core.read_namespaced_secret(TOKEN_SECRET, NAMESPACE)
    assert kept.metadata.annotations.get("helm.sh/resource-policy") == "keep"
    # The hook's Job, ServiceAccount and Role are deleted once it succeeded.
    assert not cluster.batch.list_namespaced_job(NAMESPACE).items
    assert "astro-sentinel-ensure-secrets" not in [a.metadata.name for a in
                                                   cluster.core.list_namespaced_service_account(NAMESPACE).items]
    assert _trigger_target(cluster.scaled_object(NAMESPACE, "astro-worker-alpha")) == "6"
    assert _trigger_target(cluster.scaled_object(NAMESPACE, "astro-worker-beta")) == "2"

    def hpa_target() -> str | None:
        """The target of KEDA's HPA metrics (one per trigger), while they all agree."""
        hpa = cluster.hpa(NAMESPACE, "keda-hpa-astro-worker-alpha")
        targets = {metric.external.target.average_value for metric in hpa.spec.metrics}
        return targets.pop() if len(targets) == 1 else None

    wait_for(lambda: hpa_target() == "6", 60, "KEDA's HPA target 6 after the upgrade",
             on_timeout=lambda: f"target {hpa_target()}")

    # Uninstall: none of the objects the release had is left; KEDA's token, which is not the
    # release's, stays for a reinstall.
    objects = release.manifest()
    release.uninstall()
    left = [f"{o['kind']}/{o['metadata']['name']}" for o in objects if _live(client, o) is not None]
    assert not left, f"left behind after helm uninstall: {left}"
    assert cluster.secret_value(NAMESPACE, TOKEN_SECRET, "token") == TOKEN
    wait_for(lambda: cluster.hpa(NAMESPACE, "keda-hpa-astro-worker-alpha") is None, 60,
             "KEDA to delete the HPA it made")
    labelled = cluster.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/instance=install")
    wait_for(lambda: not cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/instance=install").items, 120,
        "the release's pods to be gone", on_timeout=lambda: str([p.metadata.name for p in labelled.items]))
