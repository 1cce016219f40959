"""Fast checks of the kubelet stand-in (standin/) against the real control plane, on the
kubelet rules the other scenarios rely on: a container's environment and volumes, readiness,
restarts, graceful deletion (SIGTERM, the grace period, SIGKILL, the final DELETE), init
containers and sidecars (their order, restarts and termination order), and what one container
of a Pod can see of another (processes, volumes).

The stand-in under test runs its own tainted Node with its own Pod range, next to the stage's
nodes; its "image" is this Python, so each container is a few lines of Python given with
``command: [python, -c, ...]``. Each test has its own namespace. Each container is PID 1 of its
own PID namespace, where a signal without a handler does nothing (SIGKILL aside): the snippets
that should end on SIGTERM handle it.
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
from standin.sandbox import MountPoints

HERE = Path(__file__).resolve().parent

NODE = "standin-test"
POD_NET = "10.250.0."
TAINT = "astro.test/node-standin=only:NoSchedule"
CANARY = "NODE_STANDIN_TEST_CANARY"  # in the stand-in's environment, never in a container's
WORK = Path(os.environ["ASTRO_CLUSTER_WORK"]) / "node-standin-test"  # set by run.sh (conftest checks)

# A container that serves what it sees: its environment, hostname and the files it is asked for
# (on $PORT, 8080 by default).
SERVER = """
import http.server, json, os, signal, socket, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
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
http.server.HTTPServer(("0.0.0.0", int(os.environ.get("PORT", 8080))), H).serve_forever()
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
import http.server, os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
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
SLEEPER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("up", flush=True)
time.sleep(3600)
"""


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


def wait_running_and_logged(api: KubeApi, namespace: str, name: str, text: str, container: str = "main") -> dict:
    def up():
        pod = get_pod(api, namespace, name)
        if "running" not in container_state(pod, container)["state"]:
            return None
        log = container_log_path(WORK, namespace, name, container, pod["metadata"]["uid"])
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


# -- init containers, sidecars, and what one container sees of another

# Appends its word to /work/order: the order in which the containers of a Pod ran.
def appender(word: str, then: str = "") -> str:
    return f"open('/work/order', 'a').write('{word}\\n')\n{then}"


# Fails on its first two runs (the first restart is immediate, the next one waits for the crash
# back-off), succeeds on the third.
FLAKY = """
import os, sys
with open('/work/flaky-runs', 'a+') as runs:
    runs.write('run\\n')
    runs.seek(0)
    if len(runs.readlines()) <= 2:
        print('failing', flush=True)
        sys.exit(1)
""" + appender("flaky")

# A sidecar that writes a heartbeat (a fresh timestamp, swapped in atomically) to /shared until
# SIGTERM; it exits 3 once when /shared/crash appears.
HEARTBEAT = """
import os, signal, sys, time
def term(*_):
    print("got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
while True:
    if os.path.exists("/shared/crash"):
        os.remove("/shared/crash")
        print("crashing", flush=True)
        sys.exit(3)
    with open("/shared/heartbeat.tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace("/shared/heartbeat.tmp", "/shared/heartbeat")
    time.sleep(0.1)
"""

# An app container that drains on SIGTERM: it exits 0 only once it has seen the sidecar's
# heartbeat move after its SIGTERM (else the grace period ends it with SIGKILL, 137).
DRAINING = """
import signal, sys, time
def beat():
    try:
        return open("/shared/heartbeat").read()
    except OSError:
        return None
def term(*_):
    print("got SIGTERM", flush=True)
    seen = beat()
    while beat() == seen:
        time.sleep(0.05)
    print("the sidecar still beats after my SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
while True:
    time.sleep(1)
"""

# Two containers of one Pod meet on a Unix socket in a shared emptyDir: each records its own PID,
# the peer's PID as SO_PEERCRED gives it, and every process it can see in /proc (cmdline and
# environment) to /sock/$ROLE.json, then waits for SIGTERM.
PEERS = """
import json, os, signal, socket, struct, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
role = os.environ["ROLE"]
if role == "listener":
    server = socket.socket(socket.AF_UNIX)
    server.bind("/sock/peer.sock")
    server.listen()
    open("/sock/listening", "w").close()
    conn, _ = server.accept()
else:
    while not os.path.exists("/sock/listening"):
        time.sleep(0.05)
    conn = socket.socket(socket.AF_UNIX)
    conn.connect("/sock/peer.sock")
peer_pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
procs = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        procs[pid] = [open(f"/proc/{pid}/{what}", "rb").read().decode(errors="replace") for what in ("cmdline", "environ")]
    except OSError:
        pass
with open(f"/sock/{role}.tmp", "w") as f:
    json.dump({"pid": os.getpid(), "peer_pid": peer_pid, "procs": procs}, f)
os.replace(f"/sock/{role}.tmp", f"/sock/{role}.json")
while True:
    time.sleep(1)
"""


# A startupProbe that passes once the container's PID 1 handles SIGTERM (SigCgt bit 14, 0x4000),
# which a PID 1 ignores until then.
HANDLES_SIGTERM = {"exec": {"command": ["grep", "-Eq", r"^SigCgt:\s*[0-9a-f]*[4-7c-f][0-9a-f]{3}$", "/proc/1/status"]},
                   "periodSeconds": 1, "failureThreshold": 60}


def init_state(pod: dict, name: str) -> dict:
    return next((s for s in pod["status"].get("initContainerStatuses", []) if s["name"] == name), {"state": {}})


def volume_path(namespace: str, pod: dict, volume: str) -> Path:
    """Where the stand-in keeps a Pod's emptyDir or Secret volume on this machine."""
    return container_log_path(WORK, namespace, pod["metadata"]["name"], "any", pod["metadata"]["uid"]).parent / "volumes" / volume


def events_of(api: KubeApi, namespace: str, pod: str, reason: str) -> list[dict]:
    return [e for e in api.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
            if e["reason"] == reason and e["involvedObject"]["name"] == pod]


def test_init_containers_then_sidecar_then_app(standin, namespace):
    """Init containers run one at a time, in order, each to completion (a failing one is retried
    with back-off); the sidecar starts next, and the app container only once the sidecar's startup
    probe has passed."""
    api = standin
    work = [{"name": "work", "mountPath": "/work"}]
    create_pod(api, namespace, "ordered", [
        {"name": "main", "command": ["python", "-c", appender("main", SLEEPER)], "volumeMounts": work}],
        initContainers=[
            {"name": "first", "image": "registry.example/tools/python:3", "volumeMounts": work,
             "command": ["python", "-c", appender("first")]},
            {"name": "flaky", "image": "registry.example/tools/python:3", "volumeMounts": work,
             "command": ["python", "-c", FLAKY]},
            {"name": "side", "image": "registry.example/tools/python:3", "volumeMounts": work, "restartPolicy": "Always",
             "command": ["python", "-c", appender("side", SLEEPER)],
             # Started only once the test has written /work/go.
             "startupProbe": {"exec": {"command": ["test", "-e", "/work/go"]}, "periodSeconds": 1, "failureThreshold": 120}}],
        volumes=[{"name": "work", "emptyDir": {}}], terminationGracePeriodSeconds=5)

    def flaky_backing_off():
        pod = get_pod(api, namespace, "ordered")
        return pod if init_state(pod, "flaky")["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff" else None

    pod = wait_for(flaky_backing_off, 30, "the failed init container's back-off")
    order = volume_path(namespace, pod, "work") / "order"
    flaky = init_state(pod, "flaky")
    assert flaky["lastState"]["terminated"]["exitCode"] == 1 and flaky["restartCount"] == 1, flaky
    assert init_state(pod, "first")["state"]["terminated"]["reason"] == "Completed"
    assert init_state(pod, "first")["ready"] is True
    assert init_state(pod, "side")["state"]["waiting"]["reason"] == "PodInitializing"
    assert container_state(pod, "main")["state"]["waiting"]["reason"] == "PodInitializing"
    assert pod["status"]["phase"] == "Pending" and condition(pod, "Initialized") == "False"
    assert order.read_text() == "first\n"

    def side_probed_twice():
        pod = get_pod(api, namespace, "ordered")
        failures = [e for e in events_of(api, namespace, "ordered", "Unhealthy") if "Startup probe failed" in e["message"]]
        return pod if failures and sum(e.get("count", 1) for e in failures) >= 2 else None

    pod = wait_for(side_probed_twice, 40, "the retried init container, then the sidecar's startup probe failing twice")
    side = init_state(pod, "side")
    assert "running" in side["state"] and side["started"] is False and side["ready"] is False, side
    assert init_state(pod, "flaky")["restartCount"] == 2 and init_state(pod, "flaky")["state"]["terminated"]["exitCode"] == 0
    assert container_state(pod, "main")["state"]["waiting"]["reason"] == "PodInitializing"
    assert condition(pod, "Initialized") == "False" and pod["status"]["phase"] == "Pending"
    assert order.read_text() == "first\nflaky\nside\n", "the app container started before the sidecar's startup probe passed"

    (order.parent / "go").touch()

    def ready_and_app_ran():
        pod = get_pod(api, namespace, "ordered")
        return pod if condition(pod, "Ready") == "True" and order.read_text().count("\n") == 4 else None

    pod = wait_for(ready_and_app_ran, 30, "the sidecar started, then the app container, and the Pod Ready",
                   on_timeout=order.read_text)
    assert order.read_text() == "first\nflaky\nside\nmain\n"
    side = init_state(pod, "side")
    assert side["started"] is True and side["ready"] is True and "running" in side["state"]
    assert condition(pod, "Initialized") == "True" and pod["status"]["phase"] == "Running"
    steps = lifecycle_log_path(WORK, namespace, "ordered", pod["metadata"]["uid"]).read_text()
    assert steps.index("container side: startup probe succeeded") < steps.index("container main: started")
    delete_and_record(api, namespace, "ordered")


def test_sidecar_restarts_and_outlives_the_app(standin, namespace):
    """A sidecar that exits is restarted (restartPolicy Never notwithstanding) while the app runs
    on; on deletion the app container gets SIGTERM first, the sidecar keeps beating until the app
    has exited, then gets its SIGTERM."""
    api = standin
    shared = [{"name": "shared", "mountPath": "/shared"}]
    create_pod(api, namespace, "drain", [
        {"name": "main", "command": ["python", "-c", DRAINING], "volumeMounts": shared}],
        initContainers=[{"name": "side", "image": "registry.example/tools/python:3", "restartPolicy": "Always",
                         "command": ["python", "-c", HEARTBEAT], "volumeMounts": shared}],
        volumes=[{"name": "shared", "emptyDir": {}}], restartPolicy="Never", terminationGracePeriodSeconds=20)
    pod = wait_running_and_logged(api, namespace, "drain", "up")
    uid = pod["metadata"]["uid"]
    assert init_state(pod, "side")["started"] is True

    (volume_path(namespace, pod, "shared") / "crash").touch()

    def side_restarted():
        pod = get_pod(api, namespace, "drain")
        side = init_state(pod, "side")
        return pod if side.get("restartCount") == 1 and "running" in side["state"] else None

    pod = wait_for(side_restarted, 30, "the sidecar restarted after exiting with code 3")
    assert init_state(pod, "side")["lastState"]["terminated"]["exitCode"] == 3
    main = container_state(pod, "main")
    assert main["restartCount"] == 0 and "running" in main["state"], main
    assert pod["status"]["phase"] == "Running"

    recorder, took = delete_and_record(api, namespace, "drain")
    assert took < 15, f"deletion took {took:.1f}s with a grace period of 20 s and containers that exit on SIGTERM"
    final = recorder.versions[-1]
    assert container_state(final, "main")["state"]["terminated"]["exitCode"] == 0, "the app did not see the sidecar beat after its SIGTERM"
    assert init_state(final, "side")["state"]["terminated"]["exitCode"] == 0
    assert final["status"]["phase"] == "Succeeded"
    assert "the sidecar still beats after my SIGTERM" in container_log_path(WORK, namespace, "drain", "main", uid).read_text()
    assert "got SIGTERM" in container_log_path(WORK, namespace, "drain", "side", uid).read_text()
    steps = lifecycle_log_path(WORK, namespace, "drain", uid).read_text()
    assert (steps.index("container main: SIGTERM to pid") < steps.index("container main: exited with code 0")
            < steps.index("container side: SIGTERM to pid")), steps


def test_sidecars_stop_when_the_app_completes(standin, namespace):
    """With restartPolicy Never, a Pod whose app container has ended stops its sidecars (the later
    one first, the earlier once it has ended) and is Succeeded, whatever the sidecars' exit codes."""
    api = standin
    create_pod(api, namespace, "job", [{"name": "main", "command": ["python", "-c", "print('done', flush=True)"]}],
               initContainers=[{"name": name, "image": "registry.example/tools/python:3", "restartPolicy": "Always",
                                "command": ["python", "-c", ON_TERM.format(exit_on_term=exits)], "startupProbe": HANDLES_SIGTERM}
                               for name, exits in (("early", False), ("late", True))],
               restartPolicy="Never", terminationGracePeriodSeconds=3)

    def succeeded():
        pod = get_pod(api, namespace, "job")
        return pod if pod["status"].get("phase") == "Succeeded" else None

    pod = wait_for(succeeded, 40, "the Pod Succeeded once its app container has ended")
    assert init_state(pod, "late")["state"]["terminated"]["exitCode"] == 0, pod["status"]
    assert init_state(pod, "early")["state"]["terminated"]["exitCode"] == 137, pod["status"]  # it ignores SIGTERM
    steps = lifecycle_log_path(WORK, namespace, "job", pod["metadata"]["uid"]).read_text()
    assert steps.index("the app containers have ended") < steps.index("container late: SIGTERM to pid")
    assert steps.index("container late: exited with code 0") < steps.index("container early: SIGTERM to pid"), steps
    delete_and_record(api, namespace, "job")


def test_each_container_has_its_own_pid_namespace(standin, namespace):
    """A container's processes see only their own PID namespace in /proc (nothing of the other
    container's command line or environment), the command is PID 1, exec hooks run inside, and a
    Unix-socket peer in another container of the Pod shows PID 0 through SO_PEERCRED."""
    api = standin
    secret = f"secret-{uuid.uuid4().hex}"
    sock = [{"name": "sock", "mountPath": "/sock"}]
    create_pod(api, namespace, "peers", [
        {"name": "client", "command": ["python", "-c", PEERS], "env": [{"name": "ROLE", "value": "client"}], "volumeMounts": sock,
         "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "test -e /proc/self/cmdline && echo inside > /sock/hook"]}}}}],
        initContainers=[{"name": "listener", "image": "registry.example/tools/python:3", "restartPolicy": "Always",
                         "command": ["python", "-c", PEERS], "volumeMounts": sock,
                         "env": [{"name": "ROLE", "value": "listener"}, {"name": "AGENT_SECRET", "value": secret}]}],
        volumes=[{"name": "sock", "emptyDir": {}}], terminationGracePeriodSeconds=5)
    pod = wait_running_and_logged(api, namespace, "peers", "", container="client")
    folder = volume_path(namespace, pod, "sock")
    files = [folder / name for name in ("listener.json", "client.json", "hook")]
    wait_for(lambda: all(f.exists() for f in files), 30, "both containers' reports and the postStart hook's file")
    reports = {role: json.loads((folder / f"{role}.json").read_text()) for role in ("listener", "client")}
    for role, report in reports.items():
        assert report["pid"] == 1, f"{role} is not PID 1 of its namespace: {report['pid']}"
        assert report["peer_pid"] == 0, f"{role} sees its peer as PID {report['peer_pid']}, not 0 (another PID namespace)"
        for pid, (cmdline, environ) in report["procs"].items():
            assert f"ROLE={role}" in environ, f"{role} sees a process of another container: {pid} {cmdline[:80]!r}"
    assert all(secret not in cmdline + environ for cmdline, environ in reports["client"]["procs"].values())
    assert any(secret in environ for _, environ in reports["listener"]["procs"].values())  # the check above can fail
    assert (folder / "hook").read_text() == "inside\n", "the postStart exec hook did not run in the container's PID namespace"
    delete_and_record(api, namespace, "peers")


def test_a_volume_is_seen_only_by_the_containers_that_mount_it(standin, namespace):
    """A Secret mounted by one container is not readable in another container of the Pod: neither
    at its mountPath nor where the stand-in keeps it on the host."""
    api = standin
    api.request("POST", f"/api/v1/namespaces/{namespace}/secrets",
                {"metadata": {"name": "creds"}, "stringData": {"pw": "hunter2"}})
    create_pod(api, namespace, "split", [
        {"name": "holder", "command": ["python", "-c", SERVER], "env": [{"name": "PORT", "value": "8081"}],
         "volumeMounts": [{"name": "creds", "mountPath": "/etc/holder-secret"}],
         "readinessProbe": {"tcpSocket": {"port": 8081}, "periodSeconds": 1}},
        {"name": "other", "command": ["python", "-c", SERVER],
         "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}],
        volumes=[{"name": "creds", "secret": {"secretName": "creds"}}], terminationGracePeriodSeconds=5)

    def ready():
        pod = get_pod(api, namespace, "split")
        return pod if condition(pod, "Ready") == "True" else None

    pod = wait_for(ready, 30, "both containers serving")
    host_side = volume_path(namespace, pod, "creds") / "pw"
    assert host_side.read_text() == "hunter2"
    paths = f"/etc/holder-secret/pw,{host_side}"

    def files(port: int) -> dict:
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{port}/?{paths}", timeout=5) as resp:
            return json.load(resp)["files"]

    assert files(8081)["/etc/holder-secret/pw"] == "hunter2"
    seen = files(8080)
    assert "hunter2" not in seen["/etc/holder-secret/pw"] and "Error" in seen["/etc/holder-secret/pw"], seen
    assert "hunter2" not in seen[str(host_side)] and "Error" in seen[str(host_side)], seen
    assert "hunter2" not in files(8081)[str(host_side)]
    delete_and_record(api, namespace, "split")


def test_a_claim_mounts_its_bound_volume_and_waits_until_bound(standin, namespace):
    """A persistentVolumeClaim volume: the Pod waits (ContainerCreating, FailedMount) while its
    claim is unbound; once kube-controller-manager binds it to a hostPath PersistentVolume the
    container writes there, and what it wrote outlives the Pod, as on a real node."""
    api = standin
    storage_class = f"manual-{namespace}"  # one per test: the binder matches claims by class
    folder = WORK / "volumes" / namespace
    claim = {"metadata": {"name": "data"},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                      "resources": {"requests": {"storage": "1Mi"}}}}
    api.request("POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", claim)
    writer = ("import pathlib, signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
              "pathlib.Path('/data/note').write_text('kept')\n"
              "print('wrote', flush=True)\n"
              "time.sleep(3600)\n")
    create_pod(api, namespace, "keeper", [{"name": "main", "command": ["python", "-c", writer],
                                           "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
               volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
               terminationGracePeriodSeconds=5)
    wait_for(lambda: any("is not bound" in e["message"] for e in events_of(api, namespace, "keeper", "FailedMount")),
             30, "a FailedMount event for the unbound claim")
    assert "running" not in container_state(get_pod(api, namespace, "keeper"), "main")["state"]

    volume = f"pv-{namespace}"
    api.request("POST", "/api/v1/persistentvolumes", {
        "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(folder)}}})
    try:
        wait_running_and_logged(api, namespace, "keeper", "wrote")
        assert (folder / "note").read_text() == "kept"
        delete_and_record(api, namespace, "keeper")
        assert (folder / "note").read_text() == "kept", "the claim's data went with the Pod"
    finally:
        api.request("DELETE", f"/api/v1/persistentvolumes/{volume}")


def test_sidecar_readiness_counts_toward_ready(standin, namespace):
    """A sidecar's readiness probe holds the Pod's Ready back, app containers ready or not."""
    api = standin
    shared = [{"name": "shared", "mountPath": "/shared"}]
    create_pod(api, namespace, "gated", [{"name": "main", "command": ["python", "-c", SLEEPER]}],
               initContainers=[{"name": "side", "image": "registry.example/tools/python:3", "restartPolicy": "Always",
                                "command": ["python", "-c", SLEEPER], "volumeMounts": shared,
                                "readinessProbe": {"exec": {"command": ["test", "-e", "/shared/ready"]}, "periodSeconds": 1}}],
               volumes=[{"name": "shared", "emptyDir": {}}], terminationGracePeriodSeconds=5)
    wait_running_and_logged(api, namespace, "gated", "up")
    pod = wait_for(lambda: events_of(api, namespace, "gated", "Unhealthy") and get_pod(api, namespace, "gated"), 30,
                   "the sidecar's readiness probe failing")
    assert condition(pod, "Ready") == "False" and condition(pod, "ContainersReady") == "False", pod["status"]
    message = next(c["message"] for c in pod["status"]["conditions"] if c["type"] == "ContainersReady")
    assert message == "containers with unready status: [side]", message
    assert container_state(pod, "main")["ready"] is True and init_state(pod, "side")["ready"] is False
    (volume_path(namespace, pod, "shared") / "ready").touch()
    def ready():
        pod = get_pod(api, namespace, "gated")
        return pod if condition(pod, "Ready") == "True" else None

    pod = wait_for(ready, 30, "the Pod Ready once its sidecar is")
    assert init_state(pod, "side")["ready"] is True
    delete_and_record(api, namespace, "gated")


def test_a_failed_init_container_fails_a_never_pod_and_stops_its_sidecars(standin, namespace):
    """Under restartPolicy Never a failed init container is not retried: the Pod fails, its app
    container never starts, and the sidecar that already runs is stopped with SIGTERM."""
    api = standin
    create_pod(api, namespace, "broken", [{"name": "main", "command": ["python", "-c", SLEEPER]}],
               initContainers=[
                   {"name": "side", "image": "registry.example/tools/python:3", "restartPolicy": "Always",
                    "command": ["python", "-c", ON_TERM.format(exit_on_term=True)], "startupProbe": HANDLES_SIGTERM},
                   {"name": "setup", "image": "registry.example/tools/python:3", "command": ["python", "-c", "raise SystemExit(2)"]}],
               restartPolicy="Never", terminationGracePeriodSeconds=5)

    def failed():
        pod = get_pod(api, namespace, "broken")
        return pod if pod["status"].get("phase") == "Failed" and "terminated" in init_state(pod, "side")["state"] else None

    pod = wait_for(failed, 30, "the Pod Failed and its sidecar stopped")
    assert init_state(pod, "setup")["state"]["terminated"]["exitCode"] == 2 and init_state(pod, "setup")["restartCount"] == 0
    assert init_state(pod, "side")["state"]["terminated"]["exitCode"] == 0, "the sidecar did not get SIGTERM"
    assert container_state(pod, "main")["state"]["waiting"]["reason"] == "PodInitializing"
    assert condition(pod, "Initialized") == "False"
    delete_and_record(api, namespace, "broken")


def test_a_pod_marked_not_ready_by_the_control_plane_is_set_ready_again(standin, namespace):
    """The node lifecycle controller marks a Pod Ready=False when its Node stopped reporting (an
    API server away for longer than the grace period); the kubelet's status manager then finds
    the API server's status at odds with its own and writes it again."""
    create_pod(standin, namespace, "steady", [{"name": "main", "command": ["python", "-c", SLEEPER]}])
    path = f"/api/v1/namespaces/{namespace}/pods/steady"

    def ready() -> str | None:
        pod = standin.request("GET", path)
        return next((c["status"] for c in pod["status"].get("conditions") or [] if c["type"] == "Ready"), None)

    wait_for(lambda: ready() == "True", 60, "steady Ready")
    marked = standin.request("PATCH", f"{path}/status", {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "NodeNotReady", "message": "as the node lifecycle controller writes it"}]}},
        patch="strategic")
    assert [c["status"] for c in marked["status"]["conditions"] if c["type"] == "Ready"] == ["False"]
    wait_for(lambda: ready() == "True", 30, "the stand-in setting steady Ready again")


# A second stand-in on the same machine, as far as mount points go: claims TARGET for a Pod of its
# own, says so, and drops the claim when told (or is killed holding it).
OTHER_STAND_IN = """
import sys
from pathlib import Path
from standin.sandbox import MountPoints
points = MountPoints(Path(sys.argv[1]))
points.acquire("pod-b", Path(sys.argv[2]), False)
print("acquired", flush=True)
if sys.stdin.readline() == "release\\n":
    points.release("pod-b")
    print("released", flush=True)
"""


def test_a_mount_point_stays_while_a_pod_of_any_stand_in_uses_it(tmp_path):
    """Removing a mount point detaches it in every mount namespace: a path one stand-in made for its
    Pod stays while a Pod of another stand-in on the machine (the stage runs two instances of its
    infrastructure at once) uses it, and goes when the last user is done or gone."""
    registry, host = tmp_path / "registry", tmp_path / "host"
    target = host / "etc" / "app" / "config"

    def other_stand_in() -> subprocess.Popen:
        other = subprocess.Popen([sys.executable, "-c", OTHER_STAND_IN, str(registry), str(target)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
        assert other.stdout.readline() == "acquired\n"
        return other

    mine = MountPoints(registry)
    mine.acquire("pod-a", target, is_file=False)
    other = other_stand_in()
    mine.release("pod-a")
    assert target.is_dir(), "removed while a Pod of the other stand-in uses it"
    other.stdin.write("release\n")
    other.stdin.flush()
    assert other.stdout.readline() == "released\n"
    assert other.wait(timeout=10) == 0
    assert not host.exists(), "the last user released it; the made folders stay behind"

    mine.acquire("pod-a", target, is_file=False)
    other = other_stand_in()
    other.kill()
    other.wait(timeout=10)
    mine.release("pod-a")
    assert not host.exists(), "the claim of a stand-in that is gone still holds the mount point"
