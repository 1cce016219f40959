"""Fast checks of the kubelet stand-in (standin/) against the real control plane, on the
kubelet rules the other scenarios rely on: a container's environment and volumes, readiness,
restarts, and graceful deletion (SIGTERM, the grace period, SIGKILL, the final DELETE).

The stand-in under test runs its own tainted Node with its own Pod range, next to the stage's
nodes; its "image" is this Python, so each container is a few lines of Python given with
``command: [python, -c, ...]``. Each test has its own namespace.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from harness.procs import Daemon, wait_for

from standin import ApiError, KubeApi, container_log_path, lifecycle_log_path

HERE = Path(__file__).resolve().parent

NODE = "standin-test"
POD_NET = "10.250.0."
TAINT = "astro.test/node-standin=only:NoSchedule"
CANARY = "NODE_STANDIN_TEST_CANARY"  # in the stand-in's environment, never in a container's
WORK = Path(os.environ["ASTRO_CLUSTER_WORK"]) / "node-standin-test"  # set by run.sh (conftest checks)

# A container that serves what it sees: its environment, hostname and the files it is asked for.
SERVER = """
import http.server, json, os, socket, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        files = {}
        for p in self.path.split("?", 1)[1].split(",") if "?" in self.path else []:
            try:
                files[p] = open(p).read()
            except OSError as e:
                files[p] = repr(e)
        body = json.dumps({"env": dict(os.environ), "hostname": socket.gethostname(), "files": files}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""

# A container that announces SIGTERM, then either exits 0 or keeps running.
ON_TERM = """
import signal, sys, time
def term(*_):
    print("got SIGTERM", flush=True)
    if {exit_on_term}:
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
while True:
    time.sleep(1)
"""

# A container that logs every request: GET /die makes its liveness probe fail (/tmp/dead), GET
# /prestop (its preStop hook) clears that, so that the run after a restart is live again.
HOOKED = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("GET", self.path, flush=True)
        if self.path == "/die":
            open("/tmp/dead", "w").close()
        elif self.path == "/prestop" and os.path.exists("/tmp/dead"):
            os.remove("/tmp/dead")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""
SLEEPER = "import time; print('up', flush=True); time.sleep(3600)"


@pytest.fixture(scope="module")
def standin(control_plane):
    """The stand-in running one tainted Node; stopped (and its Node deleted) at the end."""
    args = [sys.executable, "-m", "standin", "--kubeconfig", str(control_plane.kubeconfig),
            "--workdir", str(WORK), "--node", f"{NODE}:cpu=1,memory=2Gi,pods=10", "--pod-cidr-base", "10.250",
            "--register-with-taints", TAINT, "--image", f"python={sys.executable}", "--shutdown-grace", "3"]
    daemon = Daemon("node-standin-test", args, dict(os.environ) | {CANARY: "leaked", "PYTHONPATH": str(HERE)}, WORK / "standin.log").start()
    api = KubeApi(control_plane.kubeconfig)

    def ready() -> bool:
        daemon.check_alive()
        try:
            node = api.request("GET", f"/api/v1/nodes/{NODE}")
        except ApiError:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    wait_for(ready, 60, f"Node {NODE} Ready", on_timeout=daemon.tail)
    try:
        yield api
    finally:
        daemon.stop(timeout=30)
        api.request("DELETE", f"/api/v1/nodes/{NODE}")
    assert daemon.proc is not None and daemon.proc.returncode == 0, daemon.tail()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{NODE}." not in netns, f"the stand-in left Pod sandboxes behind:\n{netns}"


@pytest.fixture
def namespace(standin):
    name = f"standin-{uuid.uuid4().hex[:8]}"
    standin.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    try:  # the ServiceAccount admission plugin needs it; the controller-manager may not have made it yet
        standin.request("POST", f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}})
    except ApiError as e:
        if e.status != 409:
            raise
    yield name
    standin.request("DELETE", f"/api/v1/namespaces/{name}")


def create_pod(api: KubeApi, namespace: str, name: str, containers: list[dict], **spec) -> dict:
    for c in containers:
        c.setdefault("image", "registry.example/tools/python:3")
    body = {"metadata": {"name": name, "labels": {"app": name}},
            "spec": {"nodeName": NODE, "automountServiceAccountToken": False, "containers": containers} | spec}
    return api.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)


def get_pod(api: KubeApi, namespace: str, name: str) -> dict:
    return api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")


def condition(pod: dict, kind: str) -> str | None:
    return next((c["status"] for c in pod["status"].get("conditions", []) if c["type"] == kind), None)


def container_state(pod: dict, name: str) -> dict:
    return next((s for s in pod["status"].get("containerStatuses", []) if s["name"] == name), {"state": {}})


def wait_running_and_logged(api: KubeApi, namespace: str, name: str, text: str) -> dict:
    def up():
        pod = get_pod(api, namespace, name)
        if "running" not in container_state(pod, "main")["state"]:
            return None
        log = container_log_path(WORK, namespace, name, "main", pod["metadata"]["uid"])
        return pod if log.exists() and text in log.read_text() else None

    return wait_for(up, 30, f"{namespace}/{name} running and logging {text!r}")


class PodRecorder:
    """Watches one Pod from before its deletion to its removal, keeping every version seen (the
    last status the stand-in wrote is only visible between its patch and its DELETE)."""

    def __init__(self, api: KubeApi, namespace: str, name: str, version: str):
        self.versions: list[dict] = []
        self.gone = threading.Event()
        self._args = (f"/api/v1/namespaces/{namespace}/pods",
                      {"fieldSelector": f"metadata.name={name}", "resourceVersion": version, "timeoutSeconds": "60"})
        self._api = api
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        for event in self._api.watch(*self._args):
            self.versions.append(event["object"])
            if event["type"] == "DELETED":
                self.gone.set()
                return

    def last_state(self, container: str) -> dict:
        return container_state(self.versions[-1], container)["state"]


def delete_and_record(api: KubeApi, namespace: str, name: str) -> tuple[PodRecorder, float]:
    """DELETE the Pod (its own grace period) and wait for it to disappear; returns the recorder
    and how long that took."""
    pod = get_pod(api, namespace, name)
    recorder = PodRecorder(api, namespace, name, pod["metadata"]["resourceVersion"])
    start = time.monotonic()
    api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert recorder.gone.wait(60), f"{namespace}/{name} was not deleted within 60 s"
    return recorder, time.monotonic() - start


def test_environment_volumes_and_readiness(standin, namespace):
    api = standin
    api.request("POST", f"/api/v1/namespaces/{namespace}/secrets",
                {"metadata": {"name": "creds"}, "stringData": {"password": "hunter2", "user": "ada"}})
    api.request("POST", f"/api/v1/namespaces/{namespace}/configmaps",
                {"metadata": {"name": "settings"}, "data": {"MODE": "fast", "level": "3"}})
    env = [
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}},
        {"name": "ABSENT", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": True}}},
        {"name": "COMBINED", "value": "$(PASSWORD)/$(CFG_MODE)/$$(PASSWORD)/$(UNDEFINED)"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "MEMORY_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
    ]
    token = {"projected": {"sources": [{"serviceAccountToken": {"path": "token", "audience": "tests", "expirationSeconds": 3600}},
                                       {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}}
    create_pod(api, namespace, "web", [{
        "name": "main", "command": ["python", "-c", SERVER], "args": [],
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": env, "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "resources": {"limits": {"memory": "256Mi"}},
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "creds", "mountPath": "/etc/creds"}, {"name": "token", "mountPath": "/etc/test-token"},
                         {"name": "scratch", "mountPath": "/tmp"}]}],
        volumes=[{"name": "creds", "secret": {"secretName": "creds", "items": [{"key": "password", "path": "pw", "mode": 0o600}]}},
                 {"name": "token", **token}, {"name": "scratch", "emptyDir": {}}])

    def ready():
        pod = get_pod(api, namespace, "web")
        return pod if condition(pod, "Ready") == "True" else None

    pod = wait_for(ready, 30, "the readiness probe to make the Pod Ready")
    ip = pod["status"]["podIP"]
    assert ip.startswith(POD_NET) and pod["status"]["hostIP"] == "10.200.0.1"
    assert pod["status"]["phase"] == "Running" and condition(pod, "ContainersReady") == "True"
    status = container_state(pod, "main")
    assert status["ready"] and status["started"] and status["containerID"].startswith("standin://")

    def served(files: str = "") -> dict:
        with urllib.request.urlopen(f"http://{ip}:8080/?{files}", timeout=5) as resp:  # node -> Pod IP
            return json.load(resp)

    seen = served("/etc/creds/pw,/etc/test-token/token,/etc/test-token/labels,/etc/hostname")
    got = seen["env"]
    assert got["PASSWORD"] == "hunter2" and got["LEVEL"] == "3" and "ABSENT" not in got
    assert got["COMBINED"] == "hunter2/fast/$(PASSWORD)/$(UNDEFINED)"
    assert got["CFG_MODE"] == "fast" and got["CFG_level"] == "3"
    assert (got["POD_NAME"], got["POD_IP"], got["NODE_NAME"], got["APP"]) == ("web", ip, NODE, "web")
    assert got["MEMORY_MI"] == "256"
    assert got["HOSTNAME"] == "web" and seen["hostname"] == "web"
    assert (got["KUBERNETES_SERVICE_HOST"], got["KUBERNETES_SERVICE_PORT"]) == ("10.200.0.1", "6443")
    assert got["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert CANARY not in got, "the stand-in's own environment leaked into the container"
    files = seen["files"]
    assert files["/etc/creds/pw"] == "hunter2"
    assert files["/etc/test-token/token"].count(".") == 2  # a JWT from the TokenRequest API
    assert files["/etc/test-token/labels"] == 'app="web"'

    # A Secret update reaches the mounted directory (atomically, through ..data).
    api.request("PATCH", f"/api/v1/namespaces/{namespace}/secrets/creds",
                {"data": {"password": base64.b64encode(b"rotated").decode()}}, patch="merge")
    wait_for(lambda: served("/etc/creds/pw")["files"]["/etc/creds/pw"] == "rotated", 30, "the rotated Secret in the volume")

    events = api.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    started = [e for e in events if e["reason"] == "Started" and e["involvedObject"]["name"] == "web"]
    assert started and started[0]["source"] == {"component": "kubelet", "host": NODE}
    assert "serving" in container_log_path(WORK, namespace, "web", "main").read_text()


def test_deletion_kills_after_the_grace_period(standin, namespace):
    create_pod(standin, namespace, "stubborn", [{"name": "main", "command": ["python", "-c", ON_TERM.format(exit_on_term=False)]}],
               terminationGracePeriodSeconds=3)
    uid = wait_running_and_logged(standin, namespace, "stubborn", "up")["metadata"]["uid"]
    recorder, took = delete_and_record(standin, namespace, "stubborn")
    assert 3 <= took < 10, f"deletion took {took:.1f}s with a grace period of 3 s"
    final = recorder.last_state("main")
    assert final["terminated"]["exitCode"] == 137 and final["terminated"]["reason"] == "Error", final
    assert recorder.versions[-1]["status"]["phase"] == "Failed"
    assert "got SIGTERM" in container_log_path(WORK, namespace, "stubborn", "main", uid).read_text()
    steps = lifecycle_log_path(WORK, namespace, "stubborn", uid).read_text()
    assert steps.index("SIGTERM to pid") < steps.index("SIGKILL to its processes") < steps.index("DELETE with gracePeriodSeconds=0")


def test_deletion_ends_early_when_the_container_exits(standin, namespace):
    create_pod(standin, namespace, "polite", [{"name": "main", "command": ["python", "-c", ON_TERM.format(exit_on_term=True)]}],
               terminationGracePeriodSeconds=30)
    uid = wait_running_and_logged(standin, namespace, "polite", "up")["metadata"]["uid"]
    recorder, took = delete_and_record(standin, namespace, "polite")
    assert took < 10, f"deletion took {took:.1f}s although the container exits at once on SIGTERM"
    final = recorder.last_state("main")
    assert final["terminated"]["exitCode"] == 0 and final["terminated"]["reason"] == "Completed", final
    assert recorder.versions[-1]["status"]["phase"] == "Succeeded"
    steps = lifecycle_log_path(WORK, namespace, "polite", uid).read_text()
    assert "exited with code 0" in steps and "before the SIGKILL deadline" in steps and "SIGKILL to its processes" not in steps


def test_crash_loop_back_off_and_unknown_image(standin, namespace):
    create_pod(standin, namespace, "crashy", [
        {"name": "main", "command": ["python", "-c", "import sys; print('bye'); sys.exit(3)"]},
        {"name": "other", "image": "registry.example/nowhere/unknown:1.0"}])

    def backing_off():
        pod = get_pod(standin, namespace, "crashy")
        main = container_state(pod, "main")
        return pod if main["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff" else None

    pod = wait_for(backing_off, 30, "CrashLoopBackOff")
    main, other = container_state(pod, "main"), container_state(pod, "other")
    assert main["restartCount"] >= 1 and main["lastState"]["terminated"]["exitCode"] == 3
    assert other["state"]["waiting"]["reason"] in ("ErrImagePull", "ImagePullBackOff")
    assert '"unknown"' in other["state"]["waiting"]["message"]
    assert pod["status"]["phase"] == "Pending" and condition(pod, "Ready") == "False"


def test_probes_and_lifecycle_hooks(standin, namespace):
    """Every handler kind the stand-in claims, in the places it runs them: exec (startup and
    liveness probes, postStart and preStop hooks), tcpSocket (readiness), httpGet (preStop; the
    readiness probe of test_environment_volumes_and_readiness) and sleep (preStop)."""
    api = standin
    create_pod(api, namespace, "hooked", [
        {"name": "main", "command": ["python", "-c", HOOKED], "ports": [{"name": "http", "containerPort": 8080}],
         # Started once postStart has written /tmp/started: the startup probe reads it.
         "startupProbe": {"exec": {"command": ["cat", "/tmp/started"]}, "periodSeconds": 1, "failureThreshold": 30},
         "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1},
         "livenessProbe": {"exec": {"command": ["test", "!", "-e", "/tmp/dead"]}, "periodSeconds": 1, "failureThreshold": 1},
         "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "echo hooked > /tmp/started"]}},
                       "preStop": {"httpGet": {"path": "/prestop", "port": "http"}}},
         "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}]},
        {"name": "side", "command": ["python", "-c", SLEEPER],
         "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo leaving"]}}}},
        {"name": "napper", "command": ["python", "-c", SLEEPER],
         "lifecycle": {"preStop": {"sleep": {"seconds": 1}}}}],
        volumes=[{"name": "scratch", "emptyDir": {}}], terminationGracePeriodSeconds=10)

    def ready(restarts: int):
        def check():
            pod = get_pod(api, namespace, "hooked")
            main = container_state(pod, "main")
            return pod if condition(pod, "Ready") == "True" and main.get("restartCount") == restarts else None
        return check

    pod = wait_for(ready(0), 30, "the startup (exec) and readiness (tcpSocket) probes to make the Pod Ready")
    uid, ip = pod["metadata"]["uid"], pod["status"]["podIP"]
    steps = lifecycle_log_path(WORK, namespace, "hooked", uid)
    assert "container main: startup probe succeeded" in steps.read_text()

    # The liveness probe (exec) fails once /tmp/dead exists: the container is restarted, after its
    # preStop hook (httpGet, which removes it), and is started and Ready again.
    with urllib.request.urlopen(f"http://{ip}:8080/die", timeout=5):
        pass
    wait_for(ready(1), 60, "the liveness probe's restart, and the Pod Ready again",
             on_timeout=lambda: f"{steps.read_text()}\n{json.dumps(get_pod(api, namespace, 'hooked')['status'])}")
    assert "Container main failed liveness probe, will be restarted" in steps.read_text()
    log = container_log_path(WORK, namespace, "hooked", "main", uid)
    assert log.read_text().count("GET /prestop") == 1

    recorder, took = delete_and_record(api, namespace, "hooked")
    assert took < 10, f"deletion took {took:.1f}s"
    text = steps.read_text()
    assert "container side: preStop hook done" in text, text
    assert "container napper: preStop hook done after 1." in text, text
    assert "container main: preStop hook done" in text, text
    assert log.read_text().count("GET /prestop") == 2
    unhealthy = [e for e in api.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
                 if e["reason"] == "Unhealthy" and e["involvedObject"]["name"] == "hooked"]
    assert any(e["message"].startswith("Liveness probe failed") for e in unhealthy), unhealthy
