"""The false non-zero: an idle KEDA pool whose Sentinel cannot answer must not get a worker.

KEDA (2.19 and later) counts an applied fallback as an active trigger and wakes a Deployment at
zero with it. With a fallback of one replica (the chart's former default for pools that scale to
zero), every Sentinel outage longer than ``failureThreshold`` polls made KEDA read "fallback
replicas × target" as the backlog of an idle queue, take the pool to one worker, and keep it for
the cooldown (300 s by default) once the Sentinel answered 0 again. The first start of the
Sentinel after an install is such an outage. One idle pool (chart defaults for the fallback and
the cooldown, ``pollingInterval`` 2 s), in two outages:

1. Install while the Sentinel's Pod cannot be scheduled (as while its image is pulled on a new
   Node): KEDA's reads fail past the threshold, yet it never reads a backlog above 0; once the
   Sentinel serves, the pool (at the 1 replica Kubernetes gives a new Deployment) is at 0 within
   seconds, not after the cooldown, and KEDA never counted it active.
2. The pool at 0, the Sentinel scaled away: the reads fail past the threshold again and the pool
   never leaves 0.
"""

from __future__ import annotations

import threading
import time

import urllib3
from kubernetes import watch
from kubernetes.client.rest import ApiException

from harness.procs import wait_for

from conftest import chart_values
from infra.idle_pools import metrics_url
from infra.keda_readings import BACKLOG_TRIGGER, KedaReadings, Trigger
from infra.kube import condition

NAMESPACE = "astro-sentinel-away"
POOL = "astro-worker-idle"
SENTINEL = "astro-sentinel"
POLLING_INTERVAL = 2
FAILURE_THRESHOLD = 3  # the chart's default
AWAY_LABEL = "astro.test/sentinel-away"


class ReplicaLog(threading.Thread):
    """Every ``spec.replicas`` the Deployment ``name`` had, from a watch (none missed)."""

    def __init__(self, cluster, namespace: str, name: str):
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.changes: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        resource_version = None
        while not self._halt.is_set():
            try:
                for event in watch.Watch().stream(
                        self.cluster.apps.list_namespaced_deployment, self.namespace,
                        field_selector=f"metadata.name={self.name}", resource_version=resource_version,
                        timeout_seconds=5):
                    d = event["object"]
                    resource_version = d.metadata.resource_version
                    if not self.changes or self.changes[-1][1] != d.spec.replicas:
                        self.changes.append((time.time(), d.spec.replicas))
                    if self._halt.is_set():
                        break
            except ApiException as e:
                if e.status != 410:
                    raise
                resource_version = None
            except urllib3.exceptions.HTTPError:
                self._halt.wait(1.0)

    def since(self, t: float) -> list[int]:
        """The replicas it had from ``t`` on (the one it had at ``t`` first)."""
        before = [r for at, r in self.changes if at <= t]
        return before[-1:] + [r for at, r in self.changes if at > t]

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def _failed_past_threshold(readings: KedaReadings, trigger: Trigger, failed_before: float):
    """KEDA has failed more reads than the fallback's threshold (each failed read is two failed
    requests), or already read above 0, which a fallback does after exactly that many."""
    failed = readings.failed(trigger) - failed_before
    return failed >= 2 * (FAILURE_THRESHOLD + 2) or readings.above_zero(trigger)


def _wait_read_zero(readings: KedaReadings, trigger: Trigger, what: str) -> None:
    """Until the Sentinel has answered KEDA's operator twice more, and KEDA's last value is 0."""
    answered = readings.answered(trigger)
    wait_for(lambda: readings.answered(trigger) >= answered + 2 and readings.value(trigger) == 0, 120, what,
             on_timeout=lambda: f"value {readings.value(trigger)}, failed requests {readings.failed(trigger)}, "
                                f"answered {readings.answered(trigger)}")


def _status(cluster) -> str:
    return str(cluster.scaled_object(NAMESPACE, POOL).get("status"))


def _why(cluster, keda, readings: KedaReadings, trigger: Trigger) -> str:
    """What KEDA read and did, for a failure message."""
    values = sorted({r.value for r in readings.above_zero(trigger)})
    return (f"KEDA read {values} as the backlog of the idle queue; ScaledObject status {_status(cluster)}\n"
            f"KEDA's operator on {POOL}:\n{keda.operator_lines(NAMESPACE, lines=25)}")


def test_idle_pool_never_wakes_while_its_sentinel_cannot_answer(cluster, nodes, keda, airflow, release_factory):
    release = release_factory("away", NAMESPACE)
    values = chart_values(airflow)
    values["sentinel"]["nodeSelector"] = {AWAY_LABEL: "no-node-has-it"}
    values["workers"] = [{
        "name": "idle", "queues": ["cluster-sentinel-away"], "syncSlots": 2,
        # The chart's fallback and cooldown (300 s); a short polling interval.
        "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 3, "pollingInterval": POLLING_INTERVAL},
    }]
    backlog = Trigger(NAMESPACE, POOL, BACKLOG_TRIGGER)
    readings = KedaReadings(metrics_url(keda))
    replicas = ReplicaLog(cluster, NAMESPACE, POOL)
    readings.start()
    replicas.start()
    try:
        # 1. Installed while the Sentinel's Pod waits for a Node.
        release.install(values)
        wait_for(lambda: _failed_past_threshold(readings, backlog, 0), 120,
                 f"KEDA to fail more than {FAILURE_THRESHOLD} reads of the backlog",
                 on_timeout=lambda: f"failed requests {readings.failed(backlog)}; {_status(cluster)}")
        failed = readings.failed(backlog)
        cluster.apps.patch_namespaced_deployment(
            SENTINEL, NAMESPACE, {"spec": {"template": {"spec": {"nodeSelector": None}}}})
        _wait_read_zero(readings, backlog, "KEDA to read the Sentinel's backlog 0 once it serves")
        assert not readings.above_zero(backlog), (
            f"while the Sentinel was away at install: {_why(cluster, keda, readings, backlog)}")
        print(f"\ninstall: {failed:.0f} of KEDA's requests failed, then it read 0; replicas {replicas.since(0)}")
        wait_for(lambda: cluster.deployment(NAMESPACE, POOL).spec.replicas == 0, 10 * POLLING_INTERVAL,
                 "the pool at 0 once the Sentinel answers (not after the 300 s cooldown)",
                 on_timeout=lambda: _status(cluster))
        so = cluster.scaled_object(NAMESPACE, POOL)
        assert (so.get("status") or {}).get("lastActiveTime") is None, f"KEDA counted the idle pool active: {so['status']}"
        assert condition(so, "Active") != "True"

        # 2. The pool at 0; the Sentinel goes away (no Pod left, as after a Node failure).
        away = time.time()
        before = readings.failed(backlog)
        cluster.apps.patch_namespaced_deployment_scale(SENTINEL, NAMESPACE, {"spec": {"replicas": 0}})
        wait_for(lambda: _failed_past_threshold(readings, backlog, before), 120,
                 f"KEDA to fail more than {FAILURE_THRESHOLD} reads with the Sentinel away",
                 on_timeout=lambda: f"failed requests {readings.failed(backlog)}; {_status(cluster)}")
        failed = readings.failed(backlog) - before
        cluster.apps.patch_namespaced_deployment_scale(SENTINEL, NAMESPACE, {"spec": {"replicas": 1}})
        _wait_read_zero(readings, backlog, "KEDA to read 0 again from the Sentinel back")
        assert not readings.above_zero(backlog), (
            f"while the Sentinel was away from the pool at 0: {_why(cluster, keda, readings, backlog)}")
        assert replicas.since(away) == [0], f"the idle pool left 0 while the Sentinel was away: {replicas.since(away)}"
        print(f"away: {failed:.0f} of KEDA's requests failed; the pool stayed at 0")
    finally:
        replicas.stop()
        readings.stop()
