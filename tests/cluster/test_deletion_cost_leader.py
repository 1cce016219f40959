"""Two Sentinel replicas, one sets pod deletion costs: the holder of a Lease on the real API server.

The chart renders ``kubernetes.deletionCostLease`` and the Role that lets the Sentinel create that
Lease and read and renew it by name. With ``sentinel.replicaCount: 2``:

1. exactly one replica holds the Lease (its identity starts with its Pod's name) and reports
   ``astro_sentinel_deletion_cost_leader 1``; the other reports 0, and never are both 1 at once;
   each replica's watches hold the worker's Deployment and Pods only, not the Sentinel's own
   (``kubernetes.workerLabels``);
2. the holder's Pod deleted: it gives the Lease up as it stops, and another replica (the other
   one, or the deleted one's replacement) takes it well within the Lease's duration (no wait for
   expiry);
3. the new holder SIGKILLed (no release): no replica takes the Lease before its record has stood
   unrenewed for most of the duration (15 s), then one does.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from harness.procs import wait_for

from conftest import chart_values
from infra.metrics_sample import sample

NAMESPACE = "astro-deletion-cost-leader"
RELEASE = "leader"
LEASE = "astro-sentinel-deletion-cost"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
SENTINEL_PODS = "app.kubernetes.io/component=sentinel"
LEASE_DURATION = 15  # the Sentinel's own (client-go's default for controllers)
RENEW_EVERY = 5


def _ready_sentinels(cluster) -> list:
    pods = [p for p in cluster.core.list_namespaced_pod(NAMESPACE, label_selector=SENTINEL_PODS).items
            if p.metadata.deletion_timestamp is None]
    return [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]


def _holder(cluster) -> str | None:
    lease = cluster.get(LEASE_PATH)
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


def _metric(pod, series: str) -> int | None:
    """One series of a Sentinel replica's /metrics (None while it does not answer)."""
    value = sample(f"http://{pod.status.pod_ip}:39092/metrics", series)
    return None if value is None else int(value)


def _leader_gauge(pod) -> int | None:
    return _metric(pod, "astro_sentinel_deletion_cost_leader")


def _cached(pod, kind: str) -> int | None:
    return _metric(pod, f'astro_sentinel_watch_cached_objects{{kind="{kind}"}}')


class _LeaderSampler(threading.Thread):
    """Reads every Ready Sentinel's leader gauge twice a second; remembers any moment two said 1."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.both, self.samples, self._halt = cluster, [], 0, threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            try:
                leaders = [p.metadata.name for p in _ready_sentinels(self.cluster) if _leader_gauge(p) == 1]
            except Exception:  # noqa: BLE001 - one missed sample (the API server busy)
                continue
            self.samples += 1
            if len(leaders) > 1:
                self.both.append((time.time(), leaders))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def _pod_of(cluster, identity: str):
    """The Ready Sentinel Pod whose name starts the Lease holder's identity."""
    return next((p for p in _ready_sentinels(cluster) if identity.startswith(p.metadata.name + "_")), None)


def test_one_replica_holds_the_lease_and_hands_it_over(cluster, nodes, keda, airflow, release_factory):
    release = release_factory(RELEASE, NAMESPACE)
    values = chart_values(airflow)
    values["sentinel"]["replicaCount"] = 2
    values["workers"] = [{
        "name": "idle", "queues": ["cluster-deletion-cost-leader"], "syncSlots": 1,
        "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 1},
    }]
    release.install(values)
    wait_for(lambda: len(_ready_sentinels(cluster)) == 2, 120, "two Ready Sentinel replicas")
    sampler = _LeaderSampler(cluster)
    sampler.start()
    try:
        # 1. One holder, and it is the one that says so.
        first = wait_for(lambda: _holder(cluster) and _pod_of(cluster, _holder(cluster)) and _holder(cluster),
                         60, "a Sentinel replica holding the Lease")
        leader = _pod_of(cluster, first)
        (follower,) = [p for p in _ready_sentinels(cluster) if p.metadata.name != leader.metadata.name]
        wait_for(lambda: _leader_gauge(leader) == 1 and _leader_gauge(follower) == 0, 30,
                 "the holder's gauge 1, the other's 0",
                 on_timeout=lambda: f"holder {_leader_gauge(leader)}, other {_leader_gauge(follower)}")
        # The watches hold the workers' objects only (kubernetes.workerLabels): the Sentinel's
        # own Deployment and Pods share the namespace and are not among them.
        def held_only_workers(pod) -> bool:
            workers = cluster.core.list_namespaced_pod(NAMESPACE, label_selector="component=worker").items
            return _cached(pod, "Deployment") == 1 and _cached(pod, "Pod") == len(workers)

        wait_for(lambda: all(held_only_workers(p) for p in (leader, follower)), 30,
                 "each replica's watches holding the worker Deployment and its Pods only",
                 on_timeout=lambda: f"{[(_cached(p, 'Deployment'), _cached(p, 'Pod')) for p in (leader, follower)]}")
        transitions = cluster.get(LEASE_PATH)["spec"].get("leaseTransitions", 0)
        print(f"\nholder {first}; the other replica {follower.metadata.name} follows")

        # 2. The holder's Pod deleted: released as it stops, taken at once by whichever replica
        #    asks first (the other one, or the deleted one's replacement).
        deleted = time.time()
        cluster.core.delete_namespaced_pod(leader.metadata.name, NAMESPACE)
        second = wait_for(lambda: (h := _holder(cluster)) and h != first and h, 60,
                          "another replica holding the Lease after the holder's Pod was deleted", interval=0.2)
        handed_over = time.time() - deleted
        assert handed_over < LEASE_DURATION - RENEW_EVERY, (
            f"the Lease changed hands {handed_over:.1f} s after the holder was deleted: it was not released")
        assert cluster.get(LEASE_PATH)["spec"]["leaseTransitions"] == transitions + 1
        print(f"holder deleted: {second} took the Lease {handed_over:.1f} s later")

        # 3. The new holder SIGKILLed: nobody releases; another replica takes over on expiry only.
        wait_for(lambda: len(_ready_sentinels(cluster)) == 2, 120, "the deleted replica replaced")
        holder_pod = _pod_of(cluster, second)
        status = next(s for s in holder_pod.status.container_statuses if s.name == "sentinel")
        killed = time.time()
        os.kill(int(status.container_id.removeprefix("standin://")), signal.SIGKILL)
        third = wait_for(lambda: (h := _holder(cluster)) and h != second and h, 120,
                         "another identity holding the Lease after the holder was killed", interval=0.2)
        taken = time.time() - killed
        # The last renewal may have come up to RENEW_EVERY before the kill.
        assert taken >= LEASE_DURATION - RENEW_EVERY - 1, (
            f"the Lease was taken {taken:.1f} s after its holder was killed, before it could have expired")
        print(f"holder killed: {third} took the Lease {taken:.1f} s later (duration {LEASE_DURATION} s)")
    finally:
        sampler.stop()
    assert sampler.samples > 10, f"only {sampler.samples} samples of the leader gauges"
    assert not sampler.both, f"two replicas said they set the deletion costs at once: {sampler.both[:5]}"
