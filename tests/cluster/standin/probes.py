"""Probes and lifecycle handlers (postStart, preStop): httpGet, tcpSocket, exec and sleep."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import subprocess
import threading
from urllib.parse import urljoin, urlsplit
from typing import TYPE_CHECKING

from standin.common import KUBELET_VERSION

if TYPE_CHECKING:
    from standin.common import Obj
    from standin.pod import Container, PodWorker
    from standin.process import Process


def http_get(host: str, port: int, path: str, scheme: str, headers: list[Obj], timeout: float) -> tuple[bool, str]:
    """An HTTP probe or hook as the kubelet sends it: 2xx/3xx is success, redirects to the same
    host are followed (up to 10), a redirect elsewhere counts as success."""
    sent = {"User-Agent": f"kube-probe/{KUBELET_VERSION[1:].rsplit('.', 1)[0]}", "Accept": "*/*"}
    sent |= {h["name"]: h["value"] for h in headers}
    url = f"{scheme.lower()}://{host}:{port}{path or '/'}"
    try:
        for _ in range(11):
            parts = urlsplit(url)
            if parts.scheme == "https":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    parts.hostname or host, parts.port or 443, timeout=timeout, context=ssl._create_unverified_context())
            else:
                conn = http.client.HTTPConnection(parts.hostname or host, parts.port or 80, timeout=timeout)
            try:
                conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else "") or "/", headers=sent)
                resp = conn.getresponse()
                resp.read(10 * 1024)
            finally:
                conn.close()
            location = resp.getheader("Location")
            if 300 <= resp.status < 400 and location:
                target = urljoin(url, location)
                if urlsplit(target).hostname != parts.hostname:
                    return True, ""
                url = target
                continue
            if 200 <= resp.status < 400:
                return True, ""
            return False, f"HTTP probe failed with statuscode: {resp.status}"
        return False, "too many redirects"
    except (OSError, http.client.HTTPException) as e:
        return False, f'Get "{url}": {e}'


def container_port(spec: Obj, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in spec.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"unknown port name {port!r}")


def exec_in_container(proc: Process, command: list[str], timeout: float) -> tuple[bool, str]:
    """Run a command in a container's namespaces, PID namespace included (nsenter forks it there):
    it sees what the container sees, and it ends with the container. On timeout its whole process
    group goes, the part inside the container too."""
    child = subprocess.Popen(["nsenter", f"--target={proc.pid}", "--net", "--mount", "--uts", "--pid", f"--wd={proc.cwd}",
                              "--", *command], env=proc.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.communicate()
        return False, f"command {command!r} timed out"
    return child.returncode == 0, (stdout + stderr)[:10 * 1024].decode(errors="replace")


def run_handler(handler: Obj, container: Obj, proc: Process, pod_ip: str, timeout: float) -> tuple[bool, str]:
    """Run a probe or lifecycle handler against one container run; returns (success, output).
    HTTP and TCP go from the node to the Pod's IP, exec runs inside the container's namespaces."""
    try:
        if (h := handler.get("httpGet")) is not None:
            return http_get(h.get("host") or pod_ip, container_port(container, h["port"]), h.get("path", "/"),
                            h.get("scheme", "HTTP"), h.get("httpHeaders") or [], timeout)
        if (h := handler.get("tcpSocket")) is not None:
            with socket.create_connection((h.get("host") or pod_ip, container_port(container, h["port"])), timeout=timeout):
                return True, ""
        if (h := handler.get("exec")) is not None:
            return exec_in_container(proc, h["command"], timeout)
        if (h := handler.get("sleep")) is not None:
            proc.done.wait(min(float(h["seconds"]), timeout))
            return True, ""
    except (OSError, ValueError) as e:
        return False, str(e)
    return False, f"{next(iter(handler), 'empty')} handlers are not supported by this node stand-in"


class Probe:
    """One probe (startup, liveness or readiness) of one container run, on its own thread with the
    kubelet's schedule: first after initialDelaySeconds, then every periodSeconds. Liveness and
    readiness wait for the startup probe; readiness runs at once when startup succeeds."""

    def __init__(self, worker: PodWorker, container: Container, proc: Process, kind: str, spec: Obj) -> None:
        self.worker, self.container, self.proc, self.kind, self.spec = worker, container, proc, kind, spec
        self.successes = self.failures = 0
        self.stopped = threading.Event()
        self._wake = threading.Event()
        threading.Thread(target=self._run, name=f"{kind} probe {container.name}", daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()
        self._wake.set()

    def trigger(self) -> None:
        self._wake.set()

    def _sleep(self, seconds: float) -> bool:
        self._wake.wait(seconds)
        self._wake.clear()
        return self.stopped.is_set()

    def _run(self) -> None:
        if self._sleep(float(self.spec.get("initialDelaySeconds", 0))):
            return
        period, timeout = float(self.spec.get("periodSeconds", 10)), float(self.spec.get("timeoutSeconds", 1))
        while True:
            if self.kind == "startup" or self.container.started:
                ok, output = run_handler(self.spec, self.container.spec, self.proc, self.worker.pod_ip, timeout)
                self.worker.probe_result(self, ok, output)
            if self._sleep(period):
                return
