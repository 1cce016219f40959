"""Scenarios 2 and 3: the KEDA path on the real control plane.

2. A worker pool at 0 replicas gets a burst. KEDA's operator activates the Deployment (0 → 1) from
   the Sentinel's answer; the HPA KEDA made, run by the real HPA controller through KEDA's metrics
   API server, takes it to ceil(backlog / syncSlots) capped at the maximum; the tasks run in the
   agent processes of those pods. As the backlog falls the HPA scales down: deleted pods drain
   (their running tasks finish and are reported, the agent exits 0 inside the grace period), and
   after the cooldown the Deployment is back at 0.
3. A pool whose workers need more CPU than the nodes have for its maximum: the extra pods stay
   Pending (unschedulable) while the others run the backlog; nothing is lost. The Sentinel's
   scaling history and its page (in a real headless Chromium, through the Service) say that the
   workers waited for room on the cluster, and times each worker's cold start (history API,
   page, /metrics). With ``ASTRO_CLUSTER_SCREENSHOT=/some/file.png`` the
   page's screenshot is copied there.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
from datetime import datetime
from pathlib import Path

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from harness.chromium import Chromium
from harness.procs import wait_for
from harness.sentinel_page import by_id, card, loaded_range, opened, save, sign_in, until

from conftest import chart_values, dedicated_nodes
from infra.drain_check import assert_drained
from infra.kube import PodRecorder, ReplicaTimeline, condition

NAMESPACE = "astro-scaling"
RELEASE = "scaling"
SENTINEL = f"http://astro-sentinel.{NAMESPACE}.svc:39092"
BURST = "astro-worker-burst"
BIG = "astro-worker-big"
GRACE_SECONDS = 115


@pytest.fixture(scope="module")
def scaling(cluster, nodes, keda, airflow, release_factory):
    """One release with two KEDA pools at 0: `burst` (syncSlots 2, max 4, small pods) and `big`
    (syncSlots 3, max 4, pods that need 1.5 CPUs: one fits on a 2-CPU node; on the namespace's own
    two Nodes, so that what other scenarios run at the same time does not change what fits)."""
    release = release_factory(RELEASE, NAMESPACE)
    keda_common = {
        "enabled": True, "minReplicaCount": 0, "maxReplicaCount": 4,
        "pollingInterval": 2, "cooldownPeriod": 20,
        # The HPA's scale-down window (300 s by default) shortened so the run fits the stage; the
        # chart's default step down (at most 2 Pods per 60 s) stays.
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}},
    }
    # Idle-first scale-in (the chart's default) deletes an idle pod whenever there is one: off
    # here, and the burst marks idle pods expensive (_BusyFirst), so that a scale-down deletes a
    # pod that runs a task and the drain is exercised. Idle-first has its own scenario,
    # test_scale_in_idle_first.py.
    values = chart_values(airflow, kubernetes={"idleFirstScaleIn": False})
    values["workers"] = [
        {"name": "burst", "queues": ["cluster-burst"], "syncSlots": 2,
         "terminationGracePeriodSeconds": GRACE_SECONDS, "drainMarginSeconds": 35, "keda": keda_common},
        {"name": "big", "queues": ["cluster-big"], "syncSlots": 3,
         "resources": {"requests": {"cpu": "1500m", "memory": "512Mi"}}, "keda": keda_common,
         **dedicated_nodes(NAMESPACE)},
    ]
    release.install(values)
    token = cluster.secret_value(NAMESPACE, "astro-keda-sentinel-token", "token")
    for name in (BURST, BIG):
        wait_for(lambda: condition(cluster.scaled_object(NAMESPACE, name), "Ready") == "True", 120,
                 f"ScaledObject {name} READY True")
        wait_for(lambda: _pool_at_zero(cluster, name), 180, f"{name} at 0 replicas with no pods")
    return {"token": token, "release": release}


def _pool_at_zero(cluster, deployment: str) -> bool:
    if cluster.deployment(NAMESPACE, deployment).spec.replicas != 0:
        return False
    return not cluster.core.list_namespaced_pod(NAMESPACE, label_selector=f"deploymentName={deployment}").items


def _backlog_reader(token: str, deployment: str):
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"

    def backlog() -> float | None:
        response = session.get(f"{SENTINEL}/v1/workers/{deployment}", timeout=2)
        return response.json()["backlog"] if response.status_code == 200 else None

    return backlog


def _settled(samples, hold: float):
    """The samples (with work) whose backlog is the same as in every sample of the ``hold``
    seconds before them."""
    out = []
    for i, s in enumerate(samples):
        window = [p for p in samples[:i] if s.t - hold <= p.t]
        if (s.backlog and s.desired is not None and window and samples[0].t <= s.t - hold
                and all(p.backlog == s.backlog for p in window)):
            out.append(s)
    return out


def _history_with(token: str, deployment: str, kind: str) -> dict | None:
    """The worker's 15-minute history once it holds a finding of ``kind``."""
    response = requests.get(f"{SENTINEL}/v1/workers/{deployment}/history", params={"range": "15m"},
                            headers={"Authorization": f"Bearer {token}"}, timeout=5)
    if response.status_code != 200:
        return None
    history = response.json()
    return history if any(f["kind"] == kind for f in history["findings"]) else None


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


class _BusyFirst(threading.Thread):
    """Keeps the pool's idle pods expensive to delete (`controller.kubernetes.io/pod-deletion-cost`
    1000) and its busy ones cheap (0), so that a scale-down deletes a pod that runs a task whenever
    one does -- the case the drain is for. Left to itself, Kubernetes deletes the newest Ready pod,
    idle as often as not, and some runs never exercised the drain."""

    COST = "controller.kubernetes.io/pod-deletion-cost"

    def __init__(self, cluster, airflow, deployment: str, dag_id: str, run_id: str):
        super().__init__(daemon=True)
        self.cluster, self.airflow, self.deployment = cluster, airflow, deployment
        self.dag_id, self.run_id = dag_id, run_id
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            try:
                self._mark()
            except Exception:  # noqa: BLE001 - a failed read or patch: the next round marks again
                pass

    def _mark(self) -> None:
        busy = {t["hostname"] for t in self.airflow.client.task_instances(self.dag_id, self.run_id)
                if t["state"] == "running"}
        pods = self.cluster.core.list_namespaced_pod(NAMESPACE, label_selector=f"deploymentName={self.deployment}")
        for pod in pods.items:
            if pod.metadata.deletion_timestamp is not None:
                continue
            cost = "0" if pod.metadata.name in busy else "1000"
            if (pod.metadata.annotations or {}).get(self.COST) != cost:
                self.cluster.core.patch_namespaced_pod(pod.metadata.name, NAMESPACE,
                                                       {"metadata": {"annotations": {self.COST: cost}}})

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def _run_burst(cluster, airflow, deployment: str, dag_id: str, token: str, timeout: float, busy_first: bool = False):
    """Trigger ``dag_id`` with the pool at 0, record until the pool is back at 0 (with
    ``busy_first``, a scale-down deletes a busy pod while there is one: see _BusyFirst)."""
    pods = PodRecorder(cluster, NAMESPACE, f"deploymentName={deployment}")
    timeline = ReplicaTimeline(cluster, NAMESPACE, deployment, f"keda-hpa-{deployment}",
                               _backlog_reader(token, deployment), pods)
    steering = None
    pods.start()
    timeline.start()
    try:
        airflow.client.ensure_runnable(dag_id)
        run_id = airflow.client.trigger(dag_id)
        if busy_first:
            steering = _BusyFirst(cluster, airflow, deployment, dag_id, run_id)
            steering.start()
        state = airflow.client.wait_run(dag_id, run_id, timeout=timeout)
        tis = airflow.client.task_instances(dag_id, run_id)
        wait_for(lambda: _pool_at_zero(cluster, deployment), 180, f"{deployment} back at 0 after the cooldown")
    finally:
        if steering is not None:
            steering.stop()
        timeline.stop()
        pods.stop()
        print(f"\n{deployment} replica timeline ({dag_id}):\n{timeline.table()}")
    return state, tis, timeline, pods.snapshot()


def test_keda_scales_a_burst_from_zero_to_max_and_back_draining_deleted_pods(scaling, cluster, airflow):
    state, tis, timeline, stories = _run_burst(cluster, airflow, BURST, "cluster_burst", scaling["token"], 600,
                                               busy_first=True)

    assert state == "success", f"run ended {state}"
    assert [t["task_id"] for t in tis if t["state"] != "success"] == []
    assert len(tis) == 24
    # The tasks ran in the agent processes of this pool's pods (Airflow knows a worker by pod name).
    assert {t["hostname"] for t in tis} <= set(stories), "a task ran outside the pool's pods"

    steps = timeline.replica_steps()
    print(f"replica steps: {steps}")
    assert steps[0] == 0 and steps[-1] == 0, steps
    # KEDA's activation: 0 → 1 first; the HPA then goes to ceil(24 / 2) = 12 capped at 4.
    assert steps[1] == 1, f"the first step out of 0 is KEDA's activation to 1: {steps}"
    assert max(steps) == 4, steps
    assert any(s.desired == 4 and s.backlog is not None and s.backlog >= 7 for s in timeline.samples), \
        "the HPA never asked for the maximum while the backlog was high"
    peak = steps.index(4)
    assert steps[peak:] == sorted(steps[peak:], reverse=True), f"the pool grew again after its peak: {steps}"
    # The chart's gentle step down (seeds 002/004), as the real HPA controller applies it: at most
    # 2 Pods per 60 s (55 s here: a step is timed when the watch sees it, the HPA times it itself).
    assert timeline.most_removed_within(55) <= 2, f"more than 2 Pods removed within 60 s: {timeline.scale.changes}"
    # Where the backlog held still long enough for KEDA's poll, the HPA's sync and its 10 s
    # scale-down window, the HPA wants exactly ceil(backlog / syncSlots), capped at the maximum.
    settled = _settled(timeline.samples, hold=15.0)
    uncapped = [s for s in settled if s.backlog <= 2 * 4]
    assert uncapped, "the backlog never held still below the pool's capacity: nothing to check the target on"
    for s in settled:
        assert s.desired == min(4, math.ceil(s.backlog / 2)), \
            f"at {s.t:.0f}s the HPA wanted {s.desired} for a backlog of {s.backlog:g} (syncSlots 2, max 4)"

    # Drain: every deleted pod's agent exited 0 inside its grace period, after its tasks ended.
    deleted = [s for s in stories.values() if s.deletion_requested_at is not None]
    assert deleted, "no pod was deleted"
    busy_at_deletion = assert_drained(deleted, tis, GRACE_SECONDS)
    print(f"deleted pods that were running tasks (pod, tasks, seconds to exit): {busy_at_deletion}")
    assert busy_at_deletion, "no deleted pod was running a task: the drain was not exercised"
    _cold_starts_were_timed(scaling["token"], BURST, set(stories))


COLD_START_PHASES = ["backlogSeen", "replicasRaised", "podScheduled", "containerStarted",
                     "agentRegistered", "firstTaskRunning"]


def _cold_starts_were_timed(token: str, deployment: str, pods: set[str]) -> None:
    """The scale-up from zero is in the history as a complete cold start, every phase seen and
    in order, and in the Sentinel's histograms; prints each start's phase figures."""
    headers = {"Authorization": f"Bearer {token}"}
    response = requests.get(f"{SENTINEL}/v1/workers/{deployment}/history", params={"range": "15m"},
                            headers=headers, timeout=5)
    assert response.status_code == 200, response.text
    cold = response.json()["coldStarts"]
    assert cold["phases"] == COLD_START_PHASES
    print(f"\ncold starts of {deployment}: p50 {cold['totalP50Ms']} ms, p90 {cold['totalP90Ms']} ms")
    for s in cold["starts"]:
        steps = ", ".join(f"{d['to']} +{d['ms']}" for d in s["durations"])
        seen = ",".join(p["seen"][0] for p in s["phases"])
        print(f"  {s['worker']} {s['kind']} {s['outcome']}{' (' + s['endedBy'] + ')' if s['endedBy'] else ''}: "
              f"{steps}; total {s['totalMs']} ms [seen {seen}]")
    # The range also holds the release's install, whose first Pod KEDA took away again.
    burst = [s for s in cold["starts"] if s["worker"] in pods]
    from_zero = [s for s in burst if s["kind"] == "fromZero"]
    assert len(from_zero) == 1, "the one Pod of KEDA's activation is the start from zero"
    (first,) = from_zero
    assert first["outcome"] == "complete", first
    assert [p["phase"] for p in first["phases"]] == COLD_START_PHASES, first
    moments = [_parse_time(p["at"]) for p in first["phases"]]
    assert moments == sorted(moments), f"phases out of order: {first['phases']}"
    assert first["totalMs"] == sum(d["ms"] for d in first["durations"]) > 0, first
    assert sum(1 for s in burst if s["kind"] == "additional") >= 1, "the HPA's Pods"

    metrics = requests.get(f"{SENTINEL}/metrics", timeout=5).text
    label = f'worker="{deployment}"'

    def count(name: str, *labels: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith(name + "{") and label in line and all(l in line for l in labels))

    assert count("astro_sentinel_cold_start_seconds_count", 'start="from_zero"') >= 1
    for phase in ("replicas_raised", "pod_scheduled", "container_started", "agent_registered",
                  "first_task_running"):
        assert count("astro_sentinel_cold_start_phase_seconds_count", f'phase="{phase}"') >= 1, phase


def _page_says_workers_waited(token: str, deployment: str, folder: Path) -> None:
    """The page, through the Service: the worker's 15-minute history shows the wait in its
    tile and finding, with the Kubernetes lines drawn."""
    chromium = Chromium(folder / "chromium")
    try:
        d = chromium.start()
        sign_in(d, f"{SENTINEL}/ui/", token)
        until(d, lambda d: card(d, deployment), f"list {deployment}")
        card(d, deployment).find_element(By.CSS_SELECTOR, ".history-button").click()
        until(d, opened, "load the range it opens on")
        Select(by_id(d, "history-range")).select_by_value("15m")
        assert until(d, lambda d: loaded_range(d, "15m"), "load the 15-minute range") == 200
        waiting = by_id(d, "tile-waiting").get_attribute("aria-label")
        assert waiting.startswith("Waiting for capacity: ") and not waiting.endswith(("Never", "not available")), waiting
        findings = [li.text for li in by_id(d, "findings").find_elements(By.TAG_NAME, "li")]
        assert any(f.startswith("Workers waited for room on the cluster for ") for f in findings), findings
        chart = by_id(d, "chart")
        for key in ("wanted", "workers", "running"):
            assert chart.find_elements(By.CSS_SELECTOR, f'path[data-series="{key}"]'), f"{key} not drawn"
        assert not by_id(d, "missing-note").is_displayed()
        # The pool's start from zero, with a bar per start.
        starts = by_id(d, "cold-starts-list").find_elements(By.CSS_SELECTOR, "li.cold-start")
        assert any(li.get_attribute("data-kind") == "fromZero" for li in starts), [li.text for li in starts]
        assert all(li.find_elements(By.CSS_SELECTOR, "svg.cold-start-bar") for li in starts)
        d.execute_script("document.getElementById('cold-starts').scrollIntoView()")
        shot = save(d, folder, "cluster-scaling-history.png")
        print(f"\npage: {waiting}; findings {findings}; screenshot {shot}")
        target = os.environ.get("ASTRO_CLUSTER_SCREENSHOT")
        if target:
            shutil.copyfile(shot, target)
    finally:
        console = chromium.console()
        chromium.stop()
        print("browser console:\n  " + "\n  ".join(console))


def test_pods_wait_for_room_while_the_others_run_the_backlog(scaling, cluster, airflow, nodes, tmp_path):
    pods = PodRecorder(cluster, NAMESPACE, f"deploymentName={BIG}")
    pods.start()
    try:
        airflow.client.ensure_runnable("cluster_capacity")
        run_id = airflow.client.trigger("cluster_capacity")

        def two_running_two_waiting() -> bool:
            live = [s for s in pods.snapshot().values() if s.deleted_at is None and s.deletion_requested_at is None]
            return (sum(1 for s in live if s.node and s.ready_at) == 2
                    and sum(1 for s in live if not s.node and s.unschedulable_at) == 2)

        wait_for(two_running_two_waiting, 180, "2 big workers running and 2 Pending unschedulable",
                 on_timeout=lambda: str(pods.snapshot()))
        waiting = [p for p in cluster.core.list_namespaced_pod(NAMESPACE, label_selector=f"deploymentName={BIG}").items
                   if not p.spec.node_name]
        reasons = {c.reason for p in waiting for c in p.status.conditions or [] if c.type == "PodScheduled"}
        assert reasons == {"Unschedulable"}, reasons
        assert cluster.deployment(NAMESPACE, BIG).spec.replicas == 4

        # The Sentinel's scaling history saw it from the cluster side: on the 15-minute range a
        # state is a finding after 15 min x 15 / 1440 = 9.4 s, so the wait becomes one.
        history = wait_for(lambda: _history_with(scaling["token"], BIG, "waitingForCapacity"), 90,
                           "the history's waiting-for-room finding")
        (finding,) = [f for f in history["findings"] if f["kind"] == "waitingForCapacity"]
        print(f"\nhistory of {BIG} (15m): tiles {history['tiles']}, findings {[f['text'] for f in history['findings']]}")
        assert finding["text"].startswith("Workers waited for room on the cluster for ")
        assert history["missing"] == []
        assert history["tiles"]["waitingForCapacitySeconds"] >= 9
        assert max(p["waiting"] for p in history["series"] if p["waiting"] is not None) == 2
        assert max(p["workers"] for p in history["series"] if p["workers"] is not None) == 4
        assert max(p["running"] for p in history["series"] if p["running"] is not None) == 2
        _page_says_workers_waited(scaling["token"], BIG, tmp_path)

        state = airflow.client.wait_run("cluster_capacity", run_id, timeout=300)
        tis = airflow.client.task_instances("cluster_capacity", run_id)
        wait_for(lambda: _pool_at_zero(cluster, BIG), 180, f"{BIG} back at 0")
    finally:
        pods.stop()
    stories = pods.snapshot()
    ran_on = {s.name for s in stories.values() if s.node}
    print(f"\nbig pool: scheduled {sorted(ran_on)}, never scheduled "
          f"{sorted(s.name for s in stories.values() if not s.node)}")
    assert state == "success"
    assert len(tis) == 12 and all(t["state"] == "success" for t in tis)
    assert {t["hostname"] for t in tis} <= ran_on
