"""Chaos on the control plane itself, mid-burst: kube-apiserver stopped for 30 s and started again;
KEDA's operator and metrics API server restarted. Both break what every scenario shares, so they
run alone, after the others (marker ``alone``).

A KEDA pool (syncSlots 2, 0..3 workers, idle-first scale-in on) runs 36 tasks of 20 s per burst.

* API server: the workers keep running (and finishing) tasks while it is away -- they talk to
  Airflow, not to Kubernetes; the Sentinel notices (its history's Kubernetes lines go unknown, not
  stale) and its watches recover (their retries back off up to 4 s); idle-first deletion-cost
  patching resumes (a cost set wrong on a busy worker afterwards is set right again); no Pod is
  deleted during the outage, and every Pod deleted afterwards drains.
* KEDA: the HPA keeps the pool while KEDA's metrics API is away; afterwards KEDA's operator
  drives the pool again, back to 0 once the work is done.

Each prints its timeline, the outage's moments and the counts of tasks submitted / succeeded /
failed / lost (both 0).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

import pytest
import requests

from harness.procs import wait_for

from conftest import WORK, chart_values
from infra import outage
from infra.drain_check import assert_drained
from infra.task_counts import assert_all_succeeded
from infra.kube import PodRecorder, ReplicaTimeline, condition
from infra.metrics_sample import sample
from standin import container_log_path

pytestmark = pytest.mark.alone

NAMESPACE = "astro-outage"
RELEASE = "outage"
SENTINEL = f"http://astro-sentinel.{NAMESPACE}.svc:39092"
POOL = "astro-worker-outage"
DAG = "cluster_outage"
TASKS = 36
GRACE_SECONDS = 115
APISERVER_DOWN_SECONDS = 30


@pytest.fixture(scope="module")
def pool(cluster, nodes, keda, airflow, release_factory):
    release = release_factory(RELEASE, NAMESPACE)
    values = chart_values(airflow)
    values["workers"] = [{
        "name": "outage", "queues": ["cluster-outage"], "syncSlots": 2,
        "terminationGracePeriodSeconds": GRACE_SECONDS, "drainMarginSeconds": 35,
        "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 3, "pollingInterval": 2,
                 "cooldownPeriod": 20, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}}},
    }]
    release.install(values)
    token = cluster.secret_value(NAMESPACE, "astro-keda-sentinel-token", "token")
    wait_for(lambda: condition(cluster.scaled_object(NAMESPACE, POOL), "Ready") == "True", 120,
             f"ScaledObject {POOL} READY True")
    wait_for(lambda: _at_zero(cluster), 180, f"{POOL} at 0")
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    return session


def _at_zero(cluster) -> bool:
    return (cluster.deployment(NAMESPACE, POOL).spec.replicas == 0
            and not cluster.core.list_namespaced_pod(NAMESPACE, label_selector=f"deploymentName={POOL}").items)


def _end(ti: dict) -> float | None:
    return datetime.fromisoformat(ti["end_date"].replace("Z", "+00:00")).timestamp() if ti["end_date"] else None


COST = "controller.kubernetes.io/pod-deletion-cost"
WRONG_COST = "-5"


def _busiest_pod(airflow, run_id: str) -> str:
    """The worker Pod running the most of the run's tasks now (Airflow knows it by its name)."""
    running = Counter(t["hostname"] for t in airflow.client.task_instances(DAG, run_id) if t["state"] == "running")
    return running.most_common(1)[0][0]


def _cost_set_right(cluster, pod: str) -> str | None:
    """The Pod's deletion cost once it is no longer the wrong one the scenario wrote."""
    cost = (cluster.core.read_namespaced_pod(pod, NAMESPACE).metadata.annotations or {}).get(COST)
    return cost if cost != WRONG_COST else None


def _deletion_costs() -> dict:
    """The Sentinel's deletion-cost patches so far by outcome, and whether it holds the Lease."""
    url, patches = f"{SENTINEL}/metrics", 'astro_sentinel_pod_deletion_cost_patches_total{{outcome="{}"}}'
    return {"ok": sample(url, patches.format("ok")) or 0.0, "error": sample(url, patches.format("error")) or 0.0,
            "leader": sample(url, "astro_sentinel_deletion_cost_leader")}


def _sentinel_warnings(cluster, lines: int = 15) -> str:
    """The last warnings in the Sentinel container's log (the stand-in writes it under the
    stage's folder), for a failure message."""
    out = []
    for pod in cluster.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=sentinel").items:
        log = container_log_path(WORK / "nodes", NAMESPACE, pod.metadata.name, "sentinel", pod.metadata.uid)
        text = log.read_text(errors="replace") if log.exists() else ""
        warnings = [line[:300] for line in text.splitlines() if '"WARN"' in line or '"ERROR"' in line]
        out.append(f"{pod.metadata.name}:\n" + "\n".join(warnings[-lines:]))
    return "\n".join(out)


def _sentinel_restarts(cluster) -> list[tuple[str, int]]:
    pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=sentinel").items
    return [(p.metadata.name, sum(c.restart_count for c in p.status.container_statuses or []))
            for p in pods]


def _answers(cluster) -> bool:
    try:
        cluster.core.get_api_resources(_request_timeout=1)
        return True
    except Exception:  # noqa: BLE001 - refused, reset or timed out: not answering
        return False


def _moment(point: dict) -> float:
    return datetime.fromisoformat(point["t"].replace("Z", "+00:00")).timestamp()


def _sees_the_cluster_after(session, moment: float) -> dict | None:
    """The pool's 15-minute history once a point after ``moment`` counts its workers again."""
    response = session.get(f"{SENTINEL}/v1/workers/{POOL}/history", params={"range": "15m"}, timeout=5)
    if response.status_code != 200:
        return None
    history = response.json()
    return history if any(p["workers"] for p in history["series"] if _moment(p) > moment) else None


class _Burst:
    """One run of the DAG with the pool recorded from its trigger to the end of the run."""

    def __init__(self, cluster, airflow, session):
        self.cluster, self.airflow = cluster, airflow
        self.pods = PodRecorder(cluster, NAMESPACE, f"deploymentName={POOL}")
        self.timeline = ReplicaTimeline(cluster, NAMESPACE, POOL, f"keda-hpa-{POOL}", self._backlog(session), self.pods)
        self.events: list[tuple[float, str]] = []

    @staticmethod
    def _backlog(session):
        def backlog() -> float | None:
            response = session.get(f"{SENTINEL}/v1/workers/{POOL}", timeout=2)
            return response.json()["backlog"] if response.status_code == 200 else None
        return backlog

    def mark(self, what: str, at: float | None = None) -> float:
        at = at or time.time()
        self.events.append((at - self.timeline.t0, what))
        return at

    def __enter__(self) -> _Burst:
        self.pods.start()
        self.timeline.start()
        self.airflow.client.ensure_runnable(DAG)
        self.run_id = self.airflow.client.trigger(DAG)
        self.mark("burst triggered")
        try:
            wait_for(self._busy, 240, "three workers running tasks")
        except BaseException:
            self.__exit__()  # stop the recorders and print what they saw
            raise
        self.mark("three workers busy")
        return self

    def _busy(self) -> bool:
        running = [t for t in self.airflow.client.task_instances(DAG, self.run_id) if t["state"] == "running"]
        return len(running) >= 4 and (self.cluster.deployment(NAMESPACE, POOL).status.ready_replicas or 0) == 3

    def finish(self) -> list[dict]:
        """Waits for the run and for the pool's deletions to complete; returns the task instances
        after asserting that all of them succeeded (lost and failed: 0)."""
        state = self.airflow.client.wait_run(DAG, self.run_id, timeout=600)
        self.mark(f"run {state}")
        self.pods.wait_for_deletions(GRACE_SECONDS + 30)
        # Deletions requested from here on (the idle pool's scale-in) are not the burst's.
        self.finished_at = time.time()
        tis = self.airflow.client.task_instances(DAG, self.run_id)
        assert_all_succeeded(tis, TASKS)
        return tis

    def __exit__(self, *exc) -> None:
        self.timeline.stop()
        self.pods.stop()
        print(f"\n{POOL} timeline:\n{self.timeline.table()}\nevents:\n"
              + "\n".join(f"  {t:6.1f}s  {what}" for t, what in self.events))

    def never_at_zero_while_working(self) -> None:
        run_end = next(t for t, what in self.events if what.startswith("run "))
        assert all(s.replicas > 0 for s in self.timeline.while_work_waited(run_end)), \
            "the pool went to 0 replicas while work waited"


def test_the_api_server_away_for_30s_mid_burst(pool, cluster, control_plane, keda, airflow):
    session = pool
    with _Burst(cluster, airflow, session) as burst:
        patches_before = _deletion_costs()["ok"]
        restarts_before = _sentinel_restarts(cluster)
        down = outage.begin(control_plane, keda, "kube-apiserver", APISERVER_DOWN_SECONDS)
        began = burst.mark("kube-apiserver stopping")
        # It finishes what it serves before it goes (graceful termination, up to 15 s here).
        gone = wait_for(lambda: None if _answers(cluster) else time.time(), 60, "the API server gone", interval=0.2)
        burst.mark("kube-apiserver gone", gone)
        exited = down.wait()
        burst.mark("kube-apiserver exited (its watches closed)", exited)
        back = burst.mark("kube-apiserver ready again")
        # The watches retry within 4 s (the Sentinel's own back-off), then list again.
        history = wait_for(lambda: _sees_the_cluster_after(session, back), 120,
                           "the Sentinel's watches back (a history point with workers after the outage)")
        burst.mark("the Sentinel sees the cluster again")
        # Idle-first scale-in goes on: a cost set wrong on a busy worker is set right again.
        busy = _busiest_pod(airflow, burst.run_id)
        cluster.core.patch_namespaced_pod(busy, NAMESPACE, {"metadata": {"annotations": {COST: WRONG_COST}}})
        wrong = burst.mark(f"deletion cost of {busy} set to {WRONG_COST}")
        corrected = wait_for(lambda: _cost_set_right(cluster, busy), 30, f"the Sentinel setting {busy}'s cost right",
                             on_timeout=lambda: f"the Sentinel's deletion costs: {_deletion_costs()}; "
                                                f"its last warnings:\n{_sentinel_warnings(cluster)}")
        burst.mark(f"the Sentinel set it to {corrected}, {time.time() - wrong:.1f} s later")
        tis = burst.finish()
        costs_after = _deletion_costs()
    burst.never_at_zero_while_working()
    restarts = (restarts_before, _sentinel_restarts(cluster))
    print(f"deletion-cost patches: {patches_before} before the outage, {costs_after} at the end; "
          f"Sentinel Pods and restarts before and after: {restarts}")

    # The workers kept running tasks to the end while the API server was away.
    ended_during = [t["task_id"] for t in tis if began < _end(t) < back]
    print(f"tasks that ended while the API server was away: {ended_during}")
    assert ended_during, "no task finished during the outage"

    # No Pod was deleted while it was away; those deleted afterwards (the scale-in) drained.
    stories = burst.pods.snapshot()
    assert not [s.name for s in stories.values() if s.deletion_requested_at and began <= s.deletion_requested_at <= back], \
        "a Pod was deleted during the outage"
    deleted = [s for s in stories.values()
               if s.deletion_requested_at is not None and s.deletion_requested_at <= burst.finished_at]
    print(f"drained after the outage: {assert_drained(deleted, tis, GRACE_SECONDS)}")

    # The Sentinel said "unknown" while it could not see the cluster (and saw it again, above).
    step = history["stepSeconds"]
    # From when its process exited (until then it kept serving the watches it had: graceful
    # termination, and the Sentinel saw through them) to when it was started again: it serves
    # lists and watches from then on, before its /readyz says ready (on a loaded machine its
    # post-start hooks took more than 10 s, and a history point in between rightly had workers).
    restarted = exited + APISERVER_DOWN_SECONDS
    during = [p for p in history["series"] if exited + 5 < _moment(p) and _moment(p) + step <= restarted]
    assert during and all(p["workers"] is None for p in during), \
        f"the history shows Kubernetes lines it could not have seen: {during}"
    # The correction was the Sentinel's: it writes the slots a worker runs, never below 0 (whether
    # the worker was still busy then is a race with its tasks; test_scale_in_idle_first.py checks
    # the values).
    assert int(corrected) >= 0, f"the Sentinel set {busy}'s cost to {corrected}"


def test_keda_restarted_mid_burst(pool, cluster, control_plane, keda, airflow):
    session = pool
    with _Burst(cluster, airflow, session) as burst:
        restart = outage.begin(control_plane, keda, "keda", 0)
        burst.mark("KEDA's operator and metrics API server stopping")
        restart.wait()
        burst.mark("KEDA serving again")
        burst.finish()
        wait_for(lambda: _at_zero(cluster), 240, f"{POOL} back at 0 (KEDA drives it again)")
        burst.mark("pool at 0")
    burst.never_at_zero_while_working()
    assert condition(cluster.scaled_object(NAMESPACE, POOL), "Ready") == "True"
