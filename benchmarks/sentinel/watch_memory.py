"""The Sentinel's memory in a namespace it shares with many Pods that are not workers.

Run by watch_memory.sh inside a private network namespace. A real kube-apiserver (and etcd,
without controllers or scheduler: objects are stored, nothing acts on them) holds UNRELATED
Pods shaped like Airflow's KubernetesPodOperator Pods (env, volumes, labels, annotations,
managed fields) and a few worker pools (Deployment + Pods with the chart's worker labels).
The Sentinel watches that namespace twice, one after the other: once with
``kubernetes.workerLabels`` (what the chart renders) and once without (every Pod listed, each
trimmed as it arrives). Printed per run: the objects the watches hold and the Sentinel's RSS now
and at its peak (VmHWM), against the chart's memory limit. ``ASTRO_SENTINEL_BASELINE_BIN`` adds a
run of another build (e.g. one from before this change) without workerLabels.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests" / "cluster"))

import fake_airflow  # noqa: E402
from harness.procs import Daemon, free_port, rss_mb, wait_for  # noqa: E402
from infra.control_plane import ControlPlane  # noqa: E402
from infra.kube_api import KubeApi  # noqa: E402

UNRELATED = int(os.environ.get("BENCH_UNRELATED_PODS", "5000"))
POOLS = 3
WORKER_PODS_PER_POOL = 10
NAMESPACE = "airflow"
RELEASE = "bench"
WORKER_LABELS = {"app": "astro-agent", "component": "worker", "app.kubernetes.io/instance": RELEASE}
LIMIT_MB = 256  # the chart's default memory limit for the Sentinel


def unrelated_pod(i: int) -> dict:
    """A Pod as KubernetesPodOperator makes them: one task, its env and mounts."""
    env = [{"name": f"AIRFLOW__SETTING_{n}", "value": f"value-{i}-{n}-" + "x" * 40} for n in range(40)]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"etl-task-{i:05d}",
            "labels": {"dag_id": f"etl_{i % 50}", "task_id": f"task_{i}", "run_id": f"scheduled__2026-12-0{i % 9 + 1}",
                       "kubernetes_pod_operator": "True", "airflow_version": "3.3.2"},
            "annotations": {"dag_id": f"etl_{i % 50}", "task_id": f"task_{i}", "try_number": "1",
                            "run_id": f"scheduled__2026-12-0{i % 9 + 1}T00:00:00+00:00"},
        },
        "spec": {
            "nodeName": "nowhere",  # never scheduled, never run: only stored
            "containers": [{
                "name": "base", "image": "registry.example/etl:2026.12",
                "command": ["python", "-m", "etl.run"], "args": ["--partition", str(i)],
                "env": env,
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                "volumeMounts": [{"name": f"v{n}", "mountPath": f"/mnt/v{n}"} for n in range(4)],
            }],
            "volumes": [{"name": f"v{n}", "emptyDir": {}} for n in range(4)],
            "restartPolicy": "Never",
        },
    }


def worker_deployment(pool: int) -> dict:
    selector = {**WORKER_LABELS, "deploymentName": f"worker-{pool}"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"worker-{pool}", "labels": dict(selector)},
        "spec": {
            "replicas": WORKER_PODS_PER_POOL,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": dict(selector)},
                         "spec": {"containers": [{"name": "agent", "image": "astro-agent:bench"}]}},
        },
    }


def worker_pod(pool: int, n: int) -> dict:
    labels = {**WORKER_LABELS, "deploymentName": f"worker-{pool}", "pod-template-hash": "5d8f"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"worker-{pool}-5d8f-{n:05d}", "labels": labels},
        "spec": {"nodeName": "nowhere", "containers": [{"name": "agent", "image": "astro-agent:bench"}]},
    }


def create_all(kube: KubeApi) -> float:
    """Creates the namespace and every object; returns the seconds it took."""
    started = time.monotonic()
    kube.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    # Without kube-controller-manager nobody makes the namespace's default ServiceAccount, which
    # the API server's admission looks up for every Pod.
    kube.call("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
              {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    for pool in range(POOLS):
        kube.call("POST", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments?fieldManager=bench", worker_deployment(pool))
    pods = [worker_pod(p, n) for p in range(POOLS) for n in range(WORKER_PODS_PER_POOL)]
    pods += [unrelated_pod(i) for i in range(UNRELATED)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda pod: kube.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods?fieldManager=bench", pod),
                      pods))
    return time.monotonic() - started


def metrics(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        return r.read().decode()


def measure(work: Path, name: str, binary: str, cp: ControlPlane, fake_url: str, selected: bool) -> dict:
    """Starts a Sentinel watching the namespace, waits until its pool view is known (the
    watches listed), settles, and reads its memory."""
    folder = work / name
    folder.mkdir()
    (folder / "tokens").write_text(secrets.token_urlsafe(32) + "\n")
    (folder / "kube-token").write_text(cp.token)
    kubernetes = {"namespace": NAMESPACE}
    if selected:
        kubernetes["workerLabels"] = WORKER_LABELS
    config = {
        "refreshInterval": "2s", "stalenessLimit": "30s",
        "source": {"type": "airflow-api", "airflowApi": {"url": fake_url}},
        "auth": {"staticTokensFile": str(folder / "tokens")},
        "workers": [{"name": f"worker-{p}", "queues": [f"queue-{p}"], "syncSlots": 4,
                     "minReplicas": 0, "maxReplicas": 20} for p in range(POOLS)],
        "kubernetes": kubernetes,
    }
    (folder / "config.yaml").write_text(json.dumps(config))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASTRO_SENTINEL_")}
    daemon = Daemon(name, [binary, "--config", str(folder / "config.yaml"), "--listen", f"127.0.0.1:{port}",
                           "--kubernetes-api-url", cp.server, "--kubernetes-token-file", str(folder / "kube-token"),
                           "--kubernetes-ca-file", str(cp.ca_file)],
                    {**clean, "RUST_LOG": "warn", "ASTRO_SENTINEL_AIRFLOW_TOKEN": "fake"},
                    folder / "sentinel.log").start()
    try:
        started = time.monotonic()
        known = [f'astro_sentinel_worker_replicas{{worker="worker-{p}"}} {WORKER_PODS_PER_POOL}' for p in range(POOLS)]

        def listed() -> bool:
            daemon.check_alive()
            try:
                text = metrics(base)
            except OSError:
                return False
            return all(line in text for line in known)

        wait_for(listed, 300, f"{name}: the pool view known", on_timeout=daemon.tail)
        listed_after = time.monotonic() - started
        time.sleep(5)  # let the allocator settle after the list; the peak is kept by VmHWM anyway
        now, peak = rss_mb(daemon.pid)
        held = {kind: int(float(v)) for kind, v in
                re.findall(r'^astro_sentinel_watch_cached_objects\{kind="(\w+)"\} (\S+)$', metrics(base), re.M)}
        return {"name": name, "listed_s": listed_after, "rss": now, "peak": peak, "held": held}
    finally:
        daemon.stop(timeout=10)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="astro-watch-memory-"))
    daemons: list[Daemon] = []
    cp = ControlPlane(work / "control-plane", Path(os.environ["ASTRO_CLUSTER_BIN"]))
    try:
        print("astro-sentinel memory with unrelated Pods in the workers' namespace")
        print(f"  real kube-apiserver and etcd (no controllers); {UNRELATED} unrelated Pods shaped like "
              f"KubernetesPodOperator's, {POOLS} worker pools of {WORKER_PODS_PER_POOL} Pods; {os.cpu_count()} CPUs")
        cp.start(controllers=False)
        kube = KubeApi(cp.server, cp.token, cp.ca_file)
        took = create_all(kube)
        sample = kube.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/etl-task-00000")
        print(f"  created in {took:.1f} s; one unrelated Pod is {len(json.dumps(sample))} bytes of JSON")

        fake, fake_url = fake_airflow.start(work)
        daemons.append(fake)

        runs = [("selected", os.environ["ASTRO_SENTINEL_BIN"], True),
                ("every-pod", os.environ["ASTRO_SENTINEL_BIN"], False)]
        if os.environ.get("ASTRO_SENTINEL_BASELINE_BIN"):
            runs.append(("baseline-every-pod", os.environ["ASTRO_SENTINEL_BASELINE_BIN"], False))
        results = [measure(work, name, binary, cp, fake_url, selected) for name, binary, selected in runs]
        print(f"  {'run':<20} {'workerLabels':<13} {'objects held':<34} {'listed':>8} {'RSS':>9} {'peak':>9}")
        for r, (_, _, selected) in zip(results, runs):
            held = ", ".join(f"{k} {v}" for k, v in sorted(r["held"].items())) or "(not reported)"
            print(f"  {r['name']:<20} {'yes' if selected else 'no':<13} {held:<34} {r['listed_s']:>7.1f}s "
                  f"{r['rss']:>6.1f} MB {r['peak']:>6.1f} MB")
        failures = [f"{r['name']}: peak {r['peak']:.1f} MB > limit {LIMIT_MB} MB"
                    for r in results[:1] if r["peak"] > LIMIT_MB]
        print(f"  chart memory limit {LIMIT_MB} MiB; the chart renders workerLabels (first run)")
        for f in failures:
            print(f"  MISSED: {f}")
        return 1 if failures else 0
    finally:
        for d in reversed(daemons):
            d.stop(timeout=10)
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
