"""The test cluster as the scenarios see it: the official Kubernetes Python client against the
real API server, plus two recorders a scenario reads afterwards — the pods' life stories (from a
watch: created, scheduled or not, ready, deleted, how their containers ended) and a replica
timeline (backlog, desired, replicas, ready, sampled once a second)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from infra.kube_api import KubeApi, condition  # noqa: F401  (condition: for the scenarios)


class Cluster(KubeApi):
    """Typed API handles with the admin identity (and :class:`KubeApi`'s plain calls on the same
    connection), and a few reads the scenarios share."""

    def __init__(self, server: str, ca_file: str, token: str):
        super().__init__(server, token, ca_file)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.autoscaling = client.AutoscalingV2Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)

    def label_namespace(self, name: str, labels: dict[str, str]) -> None:
        """Creates the namespace with ``labels``, or adds them to the one that exists."""
        try:
            self.core.create_namespace({"metadata": {"name": name, "labels": labels}})
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.patch_namespace(name, {"metadata": {"labels": labels}})

    def scaled_object(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects", name)

    def hpa(self, namespace: str, name: str):
        """The HPA, or None while it does not exist."""
        try:
            return self.autoscaling.read_namespaced_horizontal_pod_autoscaler(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def deployment(self, namespace: str, name: str):
        return self.apps.read_namespaced_deployment(name, namespace)

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        import base64

        secret = self.core.read_namespaced_secret(name, namespace)
        return base64.b64decode(secret.data[key]).decode()


# ---- pods' life stories ----------------------------------------------------------------


@dataclass
class PodStory:
    """What happened to one pod, as seen through a watch of its namespace."""

    name: str
    node: str | None = None
    created: float | None = None
    ready_at: float | None = None
    unschedulable_at: float | None = None
    deletion_requested_at: float | None = None
    grace_period: int | None = None
    exit_code: int | None = None
    finished_at: datetime | None = None
    started_at: datetime | None = None
    deleted_at: float | None = None
    phases: list[str] = field(default_factory=list)


class PodRecorder(threading.Thread):
    """Watches the pods of ``namespace`` matching ``selector`` and keeps a :class:`PodStory` each.

    The kubelet stand-in reports a container's end (exit code, finish time) in the pod status
    before it finishes the deletion, so a story holds how each deleted worker's agent exited.
    """

    def __init__(self, cluster: Cluster, namespace: str, selector: str):
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.selector = cluster, namespace, selector
        self.stories: dict[str, PodStory] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._halt = threading.Event()

    def run(self) -> None:
        resource_version = None
        while not self._halt.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    self.cluster.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                    resource_version=resource_version, timeout_seconds=5,
                ):
                    pod = event["object"]
                    resource_version = pod.metadata.resource_version
                    self._record(event["type"], pod)
                    if self._halt.is_set():
                        break
            except ApiException as e:
                if e.status == 410:  # too old: start from a fresh list
                    resource_version = None
                    continue
                raise
            except urllib3.exceptions.HTTPError:
                # The API server is unreachable: at the stage's end, or for a moment.
                self._halt.wait(1.0)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def snapshot(self) -> dict[str, PodStory]:
        with self._lock:
            return {k: PodStory(**vars(v)) for k, v in self.stories.items()}

    def wait_for_deletions(self, timeout: float) -> None:
        """Waits until every pod whose deletion was requested is gone, so a story holds how its
        agent exited (a draining worker takes up to its grace period after the scale-down)."""

        def pending() -> list[str]:
            return [s.name for s in self.stories.values() if s.deletion_requested_at is not None and s.deleted_at is None]

        with self._changed:
            if not self._changed.wait_for(lambda: not pending(), timeout):
                raise TimeoutError(f"pods still terminating after {timeout:.0f} s: {pending()}")

    def _record(self, kind: str, pod) -> None:
        now = time.time()
        with self._changed:
            story = self.stories.setdefault(pod.metadata.name, PodStory(pod.metadata.name, created=now))
            story.node = pod.spec.node_name or story.node
            status = pod.status
            if status.phase and (not story.phases or story.phases[-1] != status.phase):
                story.phases.append(status.phase)
            for c in status.conditions or []:
                if c.type == "Ready" and c.status == "True" and story.ready_at is None:
                    story.ready_at = now
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    story.unschedulable_at = story.unschedulable_at or now
            if pod.metadata.deletion_timestamp and story.deletion_requested_at is None:
                story.deletion_requested_at = now
                story.grace_period = pod.metadata.deletion_grace_period_seconds
            for cs in status.container_statuses or []:
                if cs.state and cs.state.terminated:
                    story.exit_code = cs.state.terminated.exit_code
                    story.finished_at = cs.state.terminated.finished_at
                    story.started_at = cs.state.terminated.started_at
            if kind == "DELETED":
                story.deleted_at = now
            self._changed.notify_all()


# ---- replica timeline ------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float
    backlog: float | None
    desired: int | None
    replicas: int
    ready: int
    pending: int


class ScaleRecorder(threading.Thread):
    """Every ``spec.replicas`` value a Deployment takes, from a watch: a step that lasts less
    than a sampling interval (KEDA's 0 -> 1 followed at once by the HPA's 1 -> N) is kept."""

    def __init__(self, cluster: Cluster, namespace: str, deployment: str):
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.deployment = cluster, namespace, deployment
        self.changes: list[tuple[float, int]] = []  # (time seen, replicas)
        self._halt = threading.Event()

    @property
    def values(self) -> list[int]:
        return [replicas for _, replicas in self.changes]

    def run(self) -> None:
        resource_version = None
        while not self._halt.is_set():
            try:
                for event in watch.Watch().stream(
                    self.cluster.apps.list_namespaced_deployment, self.namespace,
                    field_selector=f"metadata.name={self.deployment}",
                    resource_version=resource_version, timeout_seconds=5,
                ):
                    d = event["object"]
                    resource_version = d.metadata.resource_version
                    replicas = d.spec.replicas or 0
                    if not self.changes or self.changes[-1][1] != replicas:
                        self.changes.append((time.time(), replicas))
                    if self._halt.is_set():
                        break
            except ApiException as e:
                if e.status != 410:
                    raise
                resource_version = None  # too old: start from a fresh list
            except urllib3.exceptions.HTTPError:
                self._halt.wait(1.0)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


class ReplicaTimeline(threading.Thread):
    """Samples a worker Deployment once a second: the backlog ``backlog()`` returns (the
    Sentinel's, as KEDA reads it), the HPA's desired replicas, the Deployment's replicas and
    ready replicas, and how many of its pods wait unscheduled."""

    def __init__(self, cluster: Cluster, namespace: str, deployment: str, hpa: str,
                 backlog: Callable[[], float | None], pods: PodRecorder | None = None):
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.deployment, self.hpa_name = cluster, namespace, deployment, hpa
        self.backlog, self.pods = backlog, pods
        self.samples: list[Sample] = []
        self.scale = ScaleRecorder(cluster, namespace, deployment)
        self._halt = threading.Event()
        self.t0 = time.time()

    def start(self) -> None:
        self.scale.start()
        super().start()

    def run(self) -> None:
        while not self._halt.wait(1.0):
            self._sample()
        self._sample()  # the state the scenario stopped at, which it may have waited for

    def _sample(self) -> None:
        try:
            d = self.cluster.deployment(self.namespace, self.deployment)
            hpa = self.cluster.hpa(self.namespace, self.hpa_name)
            pending = 0
            if self.pods is not None:
                pending = sum(
                    1 for s in self.pods.snapshot().values()
                    if s.unschedulable_at and not s.node and s.deleted_at is None
                )
            self.samples.append(Sample(
                t=time.time() - self.t0,
                backlog=self._backlog(),
                desired=hpa.status.desired_replicas if hpa and hpa.status else None,
                replicas=d.spec.replicas or 0,
                ready=d.status.ready_replicas or 0,
                pending=pending,
            ))
        except (ApiException, urllib3.exceptions.HTTPError):
            pass  # one missed sample; the API server answers again on the next

    def _backlog(self) -> float | None:
        try:
            return self.backlog()
        except Exception:
            return None

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)
        self.scale.stop()

    def table(self) -> str:
        """The timeline, one line per change (time, backlog, desired, replicas, ready, pending)."""
        lines = ["    t(s)  backlog  desired  replicas  ready  pending"]
        last = None
        for s in self.samples:
            row = (s.backlog, s.desired, s.replicas, s.ready, s.pending)
            if row != last:
                backlog = "-" if s.backlog is None else f"{s.backlog:g}"
                desired = "-" if s.desired is None else str(s.desired)
                lines.append(f"  {s.t:6.1f}  {backlog:>7}  {desired:>7}  {s.replicas:>8}  {s.ready:>5}  {s.pending:>7}")
                last = row
        return "\n".join(lines)

    def while_work_waited(self, until: float) -> list[Sample]:
        """The samples from the first worker up while a backlog was read, to ``until`` (the
        run's end). A Pod left from the install, sampled before the backlog appeared and then
        scaled away by KEDA, is no drop while work waited."""
        first_up = next(i for i, s in enumerate(self.samples) if s.backlog and s.replicas > 0)
        return [s for s in self.samples[first_up:] if s.t <= until]

    def replica_steps(self) -> list[int]:
        """Every ``spec.replicas`` value the Deployment took, in order (from the watch)."""
        return list(self.scale.values)

    def most_removed_within(self, seconds: float) -> int:
        """The most Pods the HPA took away within any ``seconds`` (scale-downs to 1 or more:
        the last step to 0 is KEDA's, not the HPA's)."""
        downs = [(t, before - after) for (_, before), (t, after) in zip(self.scale.changes, self.scale.changes[1:])
                 if after < before and after >= 1]
        return max((sum(n for u, n in downs if t - seconds < u <= t) for t, _ in downs), default=0)
