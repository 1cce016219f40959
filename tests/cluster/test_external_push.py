"""The external-push trigger on the real control plane: a pool at 0 replicas whose ScaledObject
polls only every 300 s wakes within seconds of a task being queued, because the Sentinel pushes
"active" to KEDA's operator over the gRPC stream (mutual TLS with the certificates the chart's
pre-install Job, `astro-sentinel ensure-secrets`, made) at the refresh that first sees the task;
the task then runs in the woken pod. An upgrade keeps those certificates and KEDA's token.
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime
from pathlib import Path

from harness.procs import wait_for

from conftest import chart_values

NAMESPACE = "astro-push"
RELEASE = "push"
DEPLOYMENT = "astro-worker-push"
SENTINEL = "astro-sentinel"
DAG = "cluster_push"
POLLING_INTERVAL = 300


def _queued_at(airflow, run_id: str) -> datetime | None:
    (ti,) = airflow.client.task_instances(DAG, run_id)
    value = ti.get("queued_when")
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _ensured(cluster) -> dict[str, dict[str, str]]:
    """The Secrets the pre-install Job made: name -> key -> text."""
    import base64

    names = ("astro-keda-sentinel-token", "astro-sentinel-external-scaler-ca",
             "astro-sentinel-external-scaler-tls", "astro-keda-external-scaler-tls")
    found = {}
    for name in names:
        secret = cluster.core.read_namespaced_secret(name, NAMESPACE)
        assert secret.metadata.labels["app.kubernetes.io/managed-by"] == "astro-sentinel", name
        assert secret.metadata.annotations["helm.sh/resource-policy"] == "keep", name
        found[name] = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
    return found


def _check_certificates(secrets: dict[str, dict[str, str]], folder: Path) -> None:
    """Both certificates chain to the one CA, each for its purpose, the serving one names the
    Service as KEDA dials it, and each key is its certificate's (openssl, not our own parser)."""
    folder.mkdir(parents=True, exist_ok=True)

    def file(secret: str, key: str) -> Path:
        path = folder / f"{secret}-{key}"
        path.write_text(secrets[secret][key])
        return path

    def openssl(*args) -> str:
        return subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, text=True).stdout

    ca = file("astro-sentinel-external-scaler-ca", "ca.crt")
    for secret, purpose in (("astro-sentinel-external-scaler-tls", "sslserver"), ("astro-keda-external-scaler-tls", "sslclient")):
        assert secrets[secret]["ca.crt"] == ca.read_text()
        out = openssl("verify", "-purpose", purpose, "-CAfile", ca, file(secret, "tls.crt"))
        assert out.strip().endswith(": OK"), out
        assert openssl("x509", "-noout", "-pubkey", "-in", file(secret, "tls.crt")) == \
            openssl("pkey", "-pubout", "-in", file(secret, "tls.key"))
    names = openssl("x509", "-noout", "-ext", "subjectAltName", "-in", file("astro-sentinel-external-scaler-tls", "tls.crt"))
    assert f"DNS:{SENTINEL}.{NAMESPACE}.svc.cluster.local" in names, names


def _keda_story(cluster, keda) -> str:
    return (f"ScaledObject status: {cluster.scaled_object(NAMESPACE, DEPLOYMENT).get('status')}\n"
            f"KEDA operator on it:\n{keda.operator_lines(DEPLOYMENT)}")


def test_a_queued_task_wakes_a_pool_at_zero_through_the_push(cluster, nodes, keda, airflow, release_factory, tmp_path):
    release = release_factory(RELEASE, NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = [{
        "name": "push", "queues": ["cluster-push"], "syncSlots": 1,
        "keda": {"enabled": True, "trigger": "external-push", "minReplicaCount": 0, "maxReplicaCount": 1,
                 "pollingInterval": POLLING_INTERVAL, "cooldownPeriod": 10},
    }]
    installed = time.monotonic()
    release.install(values)
    ensured = _ensured(cluster)
    _check_certificates(ensured, tmp_path / "certificates")
    wait_for(lambda: (cluster.deployment(NAMESPACE, SENTINEL).status.ready_replicas or 0) == 1, 180,
             f"{SENTINEL} ready")
    sentinel_ready = time.monotonic() - installed
    # Until KEDA's operator reaches the Sentinel it cannot make the HPA (GetMetricSpec fails), and
    # it retries on its controller's per-object backoff, which doubles from 5 ms with every failure:
    # the HPA appears at the first retry after the Sentinel is reachable, up to about twice as long
    # after the install as that took (here usually 12-15 s; gRPC's own re-resolving of the name adds
    # to it), and the same reconcile starts the scale loop, whose first act is to scale the
    # Deployment to 0. The wait is for those two, not for the ScaledObject's Ready condition: KEDA's
    # scale loop patches the conditions from its own older copy of the object, which can put Ready
    # back to Unknown after the reconcile set it True (seen once: HPA made and Deployment at 0 at
    # once, Ready still Unknown 300 s later, no error logged), and nothing reconciles it again.
    wait_for(lambda: cluster.hpa(NAMESPACE, f"keda-hpa-{DEPLOYMENT}") is not None, 300,
             f"keda-hpa-{DEPLOYMENT}", on_timeout=lambda: _keda_story(cluster, keda))
    hpa_made = time.monotonic() - installed
    print(f"\nSentinel ready {sentinel_ready:.1f}s and KEDA's HPA made {hpa_made:.1f}s after the install")
    if hpa_made > 60:  # far slower than usual: put KEDA's side on record
        print(_keda_story(cluster, keda))
    wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 0, 120, f"{DEPLOYMENT} at 0")

    airflow.client.ensure_runnable(DAG)
    run_id = airflow.client.trigger(DAG)
    queued = wait_for(lambda: _queued_at(airflow, run_id), 120, "the task queued")
    wait_for(lambda: cluster.deployment(NAMESPACE, DEPLOYMENT).spec.replicas == 1, 60,
             f"{DEPLOYMENT} at 1 replica",
             on_timeout=lambda: f"ScaledObject status: {cluster.scaled_object(NAMESPACE, DEPLOYMENT).get('status')}")
    woken = time.time()
    latency = woken - queued.timestamp()
    print(f"\nqueued_dttm → Deployment replicas 1 in {latency:.2f}s (pollingInterval {POLLING_INTERVAL}s)")
    # KEDA polled when the ScaledObject became ready and polls next POLLING_INTERVAL later: a
    # wake-up well within it came from the push.
    assert latency < 30, f"replicas 1 only {latency:.1f}s after the task was queued"
    assert airflow.client.wait_run(DAG, run_id, timeout=300) == "success"

    # An upgrade runs the Job again: what it made is good, so it is kept as it was.
    values["workers"][0]["keda"]["cooldownPeriod"] = 20
    release.upgrade(values)
    assert _ensured(cluster) == ensured, "an upgrade changed KEDA's token or the certificates"
