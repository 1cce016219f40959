#!/usr/bin/env python3
"""A kubelet stand-in: runs the Pods bound to one or more Nodes as processes of this machine.

The ``cluster`` test stage runs a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) but has no container runtime. This program takes the kubelet's place and keeps the
kubelet's rules wherever the tests can observe them: Node registration and Lease, container
environment, volumes, probes, restarts with back-off, Pod status and Events, graceful deletion.

An "image" is a binary of this machine (``--image NAME=PATH``; a container's image is matched by the
last path component of its repository). The image's entrypoint is that binary with no CMD: with no
``command`` a container runs ``PATH args...``; a ``command`` whose first word names the image (or
the binary's file name) runs the binary, any other command runs as written -- the host is the image.

Each Pod gets a sandbox like a real one: a network namespace with a veth to the node and an IP from
the node's podCIDR (routed as /32s, so Pods, the node and anything listening on the node's address
reach each other). Each container runs in that network namespace, in its own mount namespace
(volumes bind-mounted at their mountPath over the host's filesystem) and UTS namespace (hostname =
Pod name), with stdin on /dev/null and stdout/stderr appended to ``container_log_path(...)``.

Deviations from a real kubelet, on purpose:

* No kube-proxy: ClusterIPs route nowhere. ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the
  ``KUBERNETES_PORT*`` family name the API server's own address and port instead. Other Services'
  link variables carry their ClusterIP as the kubelet's do (``service_hosts.py`` resolves names).
* No security enforcement: processes run as root whatever runAsUser, runAsGroup, fsGroup,
  capabilities, seccomp or readOnlyRootFilesystem say, and the host's filesystem stays writable.
* No resource enforcement (no cgroups): capacity and allocatable are reported, resourceFieldRef
  is served, the scheduler uses them; nothing is limited.
* No PID namespace: a container's processes are found through its mount namespace, which every
  process it starts shares. SIGTERM goes to its main process only (a runtime signals PID 1); when
  the main process ends or the grace period runs out, every process left in that namespace gets
  SIGKILL (a runtime tears the PID namespace down).
* A mountPath missing from the host is created on the host (and removed when no container uses it).
* Secret, ConfigMap and downward API volumes are refreshed on watch events (and every minute), so
  an update lands within seconds, where a kubelet may take a minute or more.
* A restarted stand-in starts the Pods already bound to its nodes afresh (new sandbox and IP,
  restart counts from zero), as after a node reboot; Pods already Succeeded or Failed stay so.
* Unsupported, reported in the containers' waiting state: hostNetwork/hostPID/hostIPC, hostPort,
  restartable init containers (sidecars), and volumes other than emptyDir, hostPath, secret,
  configMap, downwardAPI and projected (serviceAccountToken, secret, configMap, downwardAPI).
* Not implemented: a per-Pod /etc/hosts or resolv.conf (containers see the node's), image pulls
  (every mapped image is "already present"), image updates of a running Pod, activeDeadlineSeconds,
  in-place resize, ephemeral containers, gRPC probes, the kubelet's HTTP API (no logs/exec through
  the API server: read the log files), log rotation.

Usage (as root, inside the stage's network and mount namespace)::

    node_standin.py --kubeconfig K --workdir DIR --node node-a --node node-b:cpu=4,memory=16Gi \\
        --cpu 2 --memory 8Gi --pods 20 --image astro-agent=BIN --image astro-sentinel=BIN

Helpers for tests: ``container_log_path()`` and ``lifecycle_log_path()`` (a Pod's timestamped
steps: sandbox, starts, probes, SIGTERM/SIGKILL, exits, the final DELETE).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import errno
import hashlib
import http.client
import json
import logging
import os
import platform
import queue
import random
import re
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from math import ceil
from pathlib import Path
from typing import Any, NoReturn, TypeGuard
from urllib.parse import urljoin, urlsplit

Obj = dict[str, Any]

KUBELET_VERSION = "v1.37.2"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXEC_STEP = "--exec-in-container-namespaces"  # argv[1] of the in-namespace step (see _exec_step)
MIN_GRACE = 2.0  # the kubelet never gives a container less than 2 s to stop
BACKOFF_INITIAL, BACKOFF_MAX = 10.0, 300.0  # crash-loop and image-pull back-off
SYNC_PERIOD = 60.0  # the kubelet's syncFrequency: volumes and tokens are refreshed at least this often
ERROR_RETRY = 10.0  # the pod worker's back-off after a failed sync (config errors, mount failures)
LEASE_PERIOD, LEASE_DURATION = 10.0, 40
NODE_STATUS_PERIOD = 60.0
VOLUME_KINDS_READ_ONLY = ("secret", "configMap", "downwardAPI", "projected")  # always mounted ro
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MNT_DETACH, PR_SET_PDEATHSIG = 1, 32, 4096, 16384, 2, 1

log = logging.getLogger("node-standin")


def rfc3339(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_dir(workdir: Path, namespace: str, pod: str, uid: str) -> Path:
    """The folder of one Pod: its containers' logs, its lifecycle log and its volumes."""
    return Path(workdir) / "pods" / f"{namespace}_{pod}_{uid}"


def _newest_pod_dir(workdir: Path, namespace: str, pod: str) -> Path:
    # Namespace and Pod names are DNS labels/subdomains: they never contain "_".
    dirs = [d for d in (Path(workdir) / "pods").glob(f"{namespace}_{pod}_*") if d.name.count("_") == 2]
    if not dirs:
        raise FileNotFoundError(f"no Pod {namespace}/{pod} has run under {workdir}")
    return max(dirs, key=lambda d: d.stat().st_mtime)


def container_log_path(workdir: Path, namespace: str, pod: str, container: str, uid: str | None = None) -> Path:
    """Where a container's stdout and stderr go, appended across restarts. Without ``uid``: the
    newest Pod of that name (Pods are recreated under the same name by StatefulSets and tests)."""
    base = pod_dir(workdir, namespace, pod, uid) if uid else _newest_pod_dir(workdir, namespace, pod)
    return base / f"{container}.log"


def lifecycle_log_path(workdir: Path, namespace: str, pod: str, uid: str | None = None) -> Path:
    """The stand-in's timestamped log of one Pod's lifecycle (sandbox, starts, signals, exits, DELETE)."""
    base = pod_dir(workdir, namespace, pod, uid) if uid else _newest_pod_dir(workdir, namespace, pod)
    return base / "lifecycle.log"


# ---------------------------------------------------------------------------------------------
# Kubernetes API access


class ApiError(Exception):
    """A non-2xx answer of the API server."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class KubeApi:
    """A minimal JSON client of the Kubernetes API, configured from a kubeconfig (token or client
    certificate). Objects stay plain dicts: the stand-in copies, patches and compares API objects far
    more than it models them. The third-party imports live here so the in-namespace step (this same
    file, started before every container) loads nothing but the standard library."""

    PATCH_TYPES = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json"}

    def __init__(self, kubeconfig: Path) -> None:
        import requests
        import urllib3
        import yaml

        cfg = yaml.safe_load(Path(kubeconfig).read_text())

        def named(section: str, name: str) -> Obj:
            return next(e[section[:-1]] for e in cfg[section] if e["name"] == name)

        context = named("contexts", cfg["current-context"])
        cluster, user = named("clusters", context["cluster"]), named("users", context["user"])
        self._material = tempfile.TemporaryDirectory(prefix="kubeconfig-")

        def material(section: Obj, key: str) -> str | None:
            if section.get(key):
                return str(Path(kubeconfig).parent / section[key])
            if section.get(f"{key}-data"):
                path = Path(self._material.name) / key
                path.write_bytes(base64.b64decode(section[f"{key}-data"]))
                return str(path)
            return None

        self.server: str = cluster["server"].rstrip("/")
        self._verify: bool | str = True
        if cluster.get("insecure-skip-tls-verify"):
            self._verify = False
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        elif ca := material(cluster, "certificate-authority"):
            self._verify = ca
        cert, key = material(user, "client-certificate"), material(user, "client-key")
        self._cert = (cert, key) if cert and key else None
        token = user.get("token") or (Path(user["tokenFile"]).read_text().strip() if user.get("tokenFile") else None)
        self._headers = {"Accept": "application/json", "User-Agent": f"node-standin/{KUBELET_VERSION}"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._requests = requests
        self._local = threading.local()

    def _session(self) -> Any:
        # One Session per thread: requests does not promise that a Session is thread-safe.
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._requests.Session()
            session.trust_env = False  # no proxy from the environment between us and the API server
            session.verify, session.cert = self._verify, self._cert
            session.headers.update(self._headers)
            self._local.session = session
        return session

    def request(self, method: str, path: str, body: Obj | None = None, *, params: dict[str, str] | None = None,
                patch: str | None = None, timeout: float = 30) -> Obj:
        headers = {"Content-Type": self.PATCH_TYPES[patch] if patch else "application/json"} if body is not None else {}
        resp = self._session().request(method, self.server + path, params=params, headers=headers, timeout=timeout,
                                       data=None if body is None else json.dumps(body))
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, resp.text)
        return resp.json() if resp.content else {}

    def watch(self, path: str, params: dict[str, str]) -> Iterator[Obj]:
        read_timeout = int(params.get("timeoutSeconds", "300")) + 60
        with self._session().get(self.server + path, params={**params, "watch": "true"}, stream=True,
                                 timeout=(10, read_timeout)) as resp:
            if resp.status_code >= 400:
                raise ApiError(resp.status_code, resp.text)
            for line in resp.iter_lines(chunk_size=None):
                if line:
                    yield json.loads(line)


class _Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class Informer:
    """Mirrors one API collection (list, then watch) into a cache and reports every change.

    Works like client-go's reflector: a watch resumes from the last resourceVersion seen when it
    times out; a 410 Gone, or any failure (after a back-off), starts over with a fresh list that is
    diffed against the cache, so no change is lost in between and a bad event cannot stop it."""

    def __init__(self, api: KubeApi, path: str, *, field_selector: str | None = None,
                 on_change: Callable[[str, Obj], None] | None = None) -> None:
        self._api, self._path, self._on_change = api, path, on_change
        self._selector = {"fieldSelector": field_selector} if field_selector else {}
        self._lock = threading.Lock()
        self._cache: dict[str, Obj] = {}
        self.synced = threading.Event()

    @staticmethod
    def _key(obj: Obj) -> str:
        return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"

    @staticmethod
    def _wellformed(obj: Any) -> TypeGuard[Obj]:
        return isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) and isinstance(obj["metadata"].get("name"), str)

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._cache.get(f"{namespace}/{name}")

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._cache.values())

    def start(self, stop: threading.Event) -> None:
        threading.Thread(target=self._run, args=(stop,), name=f"informer {self._path}", daemon=True).start()

    def _run(self, stop: threading.Event) -> None:
        delay = 1.0
        while not stop.is_set():
            try:
                version = self._list()
                delay = 1.0
                while not stop.is_set():
                    version = self._watch(version)
            except _Gone:
                log.info("watch of %s expired (410 Gone): listing again", self._path)
            except Exception as e:  # noqa: BLE001 - an informer must outlive any API or decoding error
                log.warning("list/watch of %s failed (%s); retrying in %.0f s", self._path, e, delay)
                stop.wait(delay)
                delay = min(delay * 2, 30.0)

    def _list(self) -> str:
        items: list[Obj] = []
        params = {"limit": "500", **self._selector}
        while True:
            page = self._api.request("GET", self._path, params=params, timeout=60)
            items += page.get("items") or []
            if not page["metadata"].get("continue"):
                break
            params["continue"] = page["metadata"]["continue"]
        fresh = {self._key(o): o for o in items if self._wellformed(o)}
        with self._lock:
            old, self._cache = self._cache, fresh
        for key, obj in old.items():
            if fresh.get(key, {}).get("metadata", {}).get("uid") != obj["metadata"].get("uid"):
                self._emit("DELETED", obj)
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None or prev["metadata"].get("uid") != obj["metadata"].get("uid"):
                self._emit("ADDED", obj)
            elif prev["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self._emit("MODIFIED", obj)
        self.synced.set()
        return page["metadata"]["resourceVersion"]

    def _watch(self, version: str) -> str:
        params = {"resourceVersion": version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(random.randint(300, 600)), **self._selector}
        try:
            for event in self._api.watch(self._path, params):
                kind, obj = event.get("type"), event.get("object")
                if kind == "ERROR":
                    code = obj.get("code") if isinstance(obj, dict) else None
                    if code == 410:
                        raise _Gone()
                    raise ApiError(int(code or 500), json.dumps(obj))
                if kind == "BOOKMARK" and isinstance(obj, dict):  # progress only: an object with no name
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    continue
                if not self._wellformed(obj) or kind not in ("ADDED", "MODIFIED", "DELETED"):
                    log.warning("ignoring a malformed watch event of %s: %.200s", self._path, json.dumps(event))
                    continue
                version = obj["metadata"].get("resourceVersion") or version
                with self._lock:
                    if kind == "DELETED":
                        self._cache.pop(self._key(obj), None)
                    else:
                        self._cache[self._key(obj)] = obj
                self._emit(kind, obj)
        except ApiError as e:
            if e.status == 410:
                raise _Gone() from e
            raise
        return version

    def _emit(self, kind: str, obj: Obj) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(kind, obj)
        except Exception:  # noqa: BLE001 - a consumer's bug must not stop the watch
            log.exception("handling %s of %s failed", kind, self._key(obj))


class EventRecorder:
    """Posts the kubelet's v1 Events from one background thread (so no Pod waits on the API to log
    an Event), counting repeats as client-go's correlator does: the same object, reason and message
    bump ``count`` on one Event instead of creating another."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._queue: queue.Queue[tuple[str, float, Obj, str, str, str]] = queue.Queue()
        self._seen: dict[tuple[str, ...], tuple[str, int]] = {}
        threading.Thread(target=self._run, name="events", daemon=True).start()

    def emit(self, node: str, pod: Obj, kind: str, reason: str, message: str, container: str = "",
             init: bool = False) -> None:
        meta = pod["metadata"]
        ref = {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"], "name": meta["name"],
               "uid": meta["uid"], "resourceVersion": meta.get("resourceVersion", "")}
        if container:
            ref["fieldPath"] = f"spec.{'initContainers' if init else 'containers'}{{{container}}}"
        self._queue.put((node, time.time(), ref, kind, reason, message))

    def _run(self) -> None:
        while True:
            node, when, ref, kind, reason, message = self._queue.get()
            try:
                self._send(node, when, ref, kind, reason, message)
            except Exception as e:  # noqa: BLE001 - losing an Event must not stop the recorder
                log.warning("could not record Event %s for %s/%s: %s", reason, ref["namespace"], ref["name"], e)

    def _send(self, node: str, when: float, ref: Obj, kind: str, reason: str, message: str) -> None:
        key = (ref["uid"], ref.get("fieldPath", ""), kind, reason, message)
        path = f"/api/v1/namespaces/{ref['namespace']}/events"
        if key in self._seen:
            name, count = self._seen[key]
            try:
                self._api.request("PATCH", f"{path}/{name}", {"count": count + 1, "lastTimestamp": rfc3339(when)},
                                  patch="merge")
                self._seen[key] = (name, count + 1)
                return
            except ApiError as e:
                if e.status != 404:
                    raise
        name = f"{ref['name']}.{time.time_ns():x}"
        self._api.request("POST", path, {
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": ref["namespace"]},
            "involvedObject": ref, "reason": reason, "message": message, "type": kind, "count": 1,
            "firstTimestamp": rfc3339(when), "lastTimestamp": rfc3339(when),
            "source": {"component": "kubelet", "host": node},
            "reportingComponent": "kubelet", "reportingInstance": node})
        self._seen[key] = (name, 1)
        if len(self._seen) > 4096:  # the correlator's cache size
            self._seen.pop(next(iter(self._seen)))


class ClusterObjects:
    """What containers read from the API: Secrets and ConfigMaps (watched, with a direct GET when an
    object is not cached yet, so a Pod created right after its Secret does not fail) and Services
    (for the service link variables)."""

    def __init__(self, api: KubeApi, on_change: Callable[[str, Obj], None]) -> None:
        self._api = api
        self.secrets = Informer(api, "/api/v1/secrets", on_change=on_change)
        self.config_maps = Informer(api, "/api/v1/configmaps", on_change=on_change)
        self.services = Informer(api, "/api/v1/services")

    def start(self, stop: threading.Event) -> None:
        for informer in (self.secrets, self.config_maps, self.services):
            informer.start(stop)

    def _get(self, informer: Informer, resource: str, namespace: str, name: str) -> Obj | None:
        obj = informer.get(namespace, name)
        if obj is not None:
            return obj
        try:
            return self._api.request("GET", f"/api/v1/namespaces/{namespace}/{resource}/{name}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        obj = self._get(self.secrets, "secrets", namespace, name)
        return None if obj is None else {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}

    def config_map_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        obj = self._get(self.config_maps, "configmaps", namespace, name)
        if obj is None:
            return None
        data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        return data | {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}


class Tokens:
    """Bound ServiceAccount tokens from the TokenRequest API, reissued once 80 % of their lifetime
    (or 24 h) has passed, as the kubelet's token manager does."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, int], tuple[bytes, float]] = {}

    def token(self, pod: Obj, audience: str, seconds: int) -> bytes:
        meta = pod["metadata"]
        key = (meta["uid"], audience, seconds)
        with self._lock:
            cached = self._cache.get(key)
        if cached and time.time() < cached[1]:
            return cached[0]
        account = pod["spec"].get("serviceAccountName") or "default"
        spec: Obj = {"expirationSeconds": seconds,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}
        if audience:
            spec["audiences"] = [audience]
        issued = time.time()
        answer = self._api.request(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        expires = datetime.strptime(answer["status"]["expirationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
        ttl = expires.replace(tzinfo=timezone.utc).timestamp() - issued
        token = answer["status"]["token"].encode()
        with self._lock:
            self._cache[key] = (token, issued + min(0.8 * ttl, 24 * 3600))
        return token

    def forget(self, uid: str) -> None:
        with self._lock:
            for key in [k for k in self._cache if k[0] == uid]:
                del self._cache[key]


# ---------------------------------------------------------------------------------------------
# Values: quantities, downward API, $(VAR) expansion, environment


def parse_quantity(text: str | int | float) -> Fraction:
    """A Kubernetes resource quantity ("250m", "1.5Gi", "2e3") as an exact number."""
    m = re.fullmatch(r"([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?", str(text).strip())
    if not m:
        raise ValueError(f"invalid quantity {text!r}")
    number = Fraction(m[1])
    if m[2]:
        return number * Fraction(10) ** int(m[2][1:])
    binary = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
    if m[3] in binary:
        return number * 1024 ** binary[m[3]]
    decimal = {"n": -9, "u": -6, "m": -3, None: 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
    return number * Fraction(10) ** decimal[m[3]]


def resource_value(pod: Obj, ref: Obj, container: str, allocatable: dict[str, Fraction]) -> str:
    """A resourceFieldRef as the kubelet renders it: limits default to the node's allocatable, and
    the value is divided by the divisor and rounded up (cpu in millicores first)."""
    name = ref.get("containerName") or container
    spec = next((c for c in pod["spec"]["containers"] + (pod["spec"].get("initContainers") or []) if c["name"] == name), None)
    if spec is None:
        raise ConfigError(f'resourceFieldRef names an unknown container "{name}"')
    kind, _, resource = ref["resource"].partition(".")
    quantity = ((spec.get("resources") or {}).get(kind) or {}).get(resource)
    value = parse_quantity(quantity) if quantity is not None else (allocatable.get(resource, Fraction(0)) if kind == "limits" else Fraction(0))
    divisor = parse_quantity(ref.get("divisor") or "1") or Fraction(1)
    if resource == "cpu":
        return str(ceil(ceil(value * 1000) / ceil(divisor * 1000)))
    return str(ceil(ceil(value) / ceil(divisor)))


def format_map(values: dict[str, str]) -> str:
    """Labels or annotations as a downward API file: sorted ``key="value"`` lines (Go's %q)."""
    return "\n".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(values.items()))


def field_value(pod: Obj, path: str, pod_ip: str, host_ip: str) -> str:
    """A downward API fieldRef, for env (single keys) and volumes (whole label/annotation maps)."""
    meta, spec = pod["metadata"], pod["spec"]
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return (meta.get(m[1]) or {}).get(m[2], "")
    values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
              "metadata.labels": format_map(meta.get("labels") or {}),
              "metadata.annotations": format_map(meta.get("annotations") or {}),
              "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": pod_ip, "status.podIPs": pod_ip, "status.hostIP": host_ip, "status.hostIPs": host_ip}
    if path not in values:
        raise Unsupported(f"fieldRef {path!r} is not supported by this node stand-in")
    return values[path]


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """``$(VAR)`` expansion exactly as the kubelet does it: ``$$`` is a literal ``$``, and an
    unknown or unclosed reference stays as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            end = text.find(")", i + 2) if nxt == "(" else -1
            if nxt == "$":
                out.append("$")
            elif end != -1:
                name = text[i + 2:end]
                value = lookup(name)
                out.append(f"$({name})" if value is None else value)
                i = end + 1
                continue
            else:
                out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def service_link_env(name: str, ip: str, ports: list[Obj]) -> dict[str, str]:
    """The kubelet's (Docker links style) variables for one Service."""
    prefix = name.upper().replace("-", "_")
    env = {f"{prefix}_SERVICE_HOST": ip, f"{prefix}_SERVICE_PORT": str(ports[0]["port"])}
    for p in ports:
        if p.get("name"):
            env[f"{prefix}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p["port"])
    host = f"[{ip}]" if ":" in ip else ip
    for i, p in enumerate(ports):
        protocol = p.get("protocol") or "TCP"
        url = f"{protocol.lower()}://{host}:{p['port']}"
        if i == 0:
            env[f"{prefix}_PORT"] = url
        base = f"{prefix}_PORT_{p['port']}_{protocol.upper()}"
        env |= {base: url, f"{base}_PROTO": protocol.lower(), f"{base}_PORT": str(p["port"]), f"{base}_ADDR": ip}
    return env


class ConfigError(Exception):
    """A Pod references an object or key that does not exist: CreateContainerConfigError for env,
    FailedMount for volumes. The kubelet retries; so does the stand-in."""


class Unsupported(Exception):
    """A Pod asks for something this stand-in does not do."""


def unsupported_features(pod: Obj) -> str | None:
    spec = pod["spec"]
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            return f"{flag} Pods are not supported by this node stand-in (every Pod gets its own namespaces)"
    for c in spec["containers"] + (spec.get("initContainers") or []):
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                return f'container "{c["name"]}" asks for hostPort {p["hostPort"]}: host ports are not supported by this node stand-in'
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            return f'init container "{c["name"]}" is a sidecar (restartPolicy Always): not supported by this node stand-in'
    return None


# ---------------------------------------------------------------------------------------------
# Sandboxes, volumes and mount points


def run_command(argv: list[str], stdin: str | None = None) -> None:
    """Run a setup command (ip ...) and raise with its stderr when it fails."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


@dataclass
class Sandbox:
    netns: str
    veth: str
    ip: str


class PodNetwork:
    """One node's Pod networking, as a CNI plugin with host-local IPAM would do it: a network
    namespace per Pod, a veth whose peer is the Pod's eth0, an IP of the node's /24 (handed out in
    turn, not reused at once), a /32 route each way through the node's address."""

    def __init__(self, node: str, prefix: str, host_ip: str) -> None:
        self._node, self._prefix, self._host_ip = node, prefix, host_ip
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._next = 2

    def _allocate(self) -> str:
        with self._lock:
            for offset in range(253):
                host = 2 + (self._next - 2 + offset) % 253
                if host not in self._used:
                    self._used.add(host)
                    self._next = host + 1
                    return f"{self._prefix}.{host}"
        raise RuntimeError(f"no Pod IP left in {self._prefix}.0/24")

    def create(self, uid: str) -> Sandbox:
        short = uid.replace("-", "")[:12]
        box = Sandbox(netns=f"{self._node}.{short}", veth=f"v{short}", ip=self._allocate())
        try:
            run_command(["ip", "netns", "add", box.netns])
            run_command(["ip", "link", "add", box.veth, "type", "veth", "peer", "name", "eth0", "netns", box.netns])
            run_command(["ip", "-n", box.netns, "-batch", "-"], "link set lo up\n"
                        f"addr add {box.ip}/32 dev eth0\nlink set eth0 up\n"
                        f"route add {self._host_ip} dev eth0\nroute add default via {self._host_ip} dev eth0\n")
            run_command(["ip", "-batch", "-"], f"link set {box.veth} up\nroute add {box.ip}/32 dev {box.veth}\n")
        except Exception:
            self.destroy(box)
            raise
        return box

    def destroy(self, box: Sandbox) -> None:
        """Remove a sandbox, killing whatever still runs in it (a runtime stops the sandbox's
        processes with it); each step tolerates what an earlier, interrupted teardown left."""
        pids = subprocess.run(["ip", "netns", "pids", box.netns], capture_output=True, text=True).stdout.split()
        kill_and_wait([int(p) for p in pids])
        subprocess.run(["ip", "link", "del", box.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", box.netns], capture_output=True)
        with self._lock:
            self._used.discard(int(box.ip.rsplit(".", 1)[1]))

    def remove_stale(self) -> None:
        """Remove the sandboxes a previous run of this node left behind (it was killed)."""
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for name in (line.split()[0] for line in listing.splitlines() if line.strip()):
            if name.startswith(f"{self._node}."):
                log.info("removing stale Pod sandbox %s", name)
                short = name.split(".")[-1]
                self.destroy(Sandbox(netns=name, veth=f"v{short}", ip=f"{self._prefix}.0"))


class MountPoints:
    """Creates on the host the mount points containers need that the host lacks, and removes them
    when no Pod uses them any more. Containers see the host's filesystem, so a mountPath like
    /etc/app/config needs a directory there (a runtime would create it in the image's root).
    Only this process's Pods are counted: two stand-ins on one machine must not share mountPaths
    that the host lacks (removing a mount point detaches it in every mount namespace)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[Path, set[str]] = {}

    def acquire(self, owner: str, target: Path, is_file: bool) -> None:
        with self._lock:
            missing: list[Path] = []
            path = target
            while not os.path.lexists(path):
                missing.append(path)
                path = path.parent
            for path in reversed(missing):
                if path == target and is_file:
                    path.touch()
                else:
                    path.mkdir()
                self._users[path] = set()
            for path in [target, *target.parents]:
                if path in self._users:
                    self._users[path].add(owner)

    def release(self, owner: str | None = None) -> None:
        """Drop one owner's claims (all claims when ``owner`` is None); remove what is unused."""
        with self._lock:
            for path in sorted(self._users, key=lambda p: -len(p.parts)):
                users = self._users[path]
                users.discard(owner) if owner else users.clear()
                if users:
                    continue
                del self._users[path]
                try:
                    path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
                except OSError as e:
                    log.warning("could not remove mount point %s: %s", path, e)


def write_atomically(target: Path, payload: dict[str, tuple[bytes, int]]) -> bool:
    """Publish files the way the kubelet's AtomicWriter does, so a reader never sees a half-updated
    set and a directory mount sees every update: the files live in a timestamped directory,
    ``..data`` is a symlink to it swapped by rename(2), and each visible name is a symlink through
    ``..data``. Returns whether anything changed."""
    target.mkdir(parents=True, exist_ok=True)
    data_link = target / "..data"
    old_dir = target / os.readlink(data_link) if data_link.is_symlink() else None
    if old_dir is not None:
        current = {str(f.relative_to(old_dir)): (f.read_bytes(), f.stat().st_mode & 0o777)
                   for f in old_dir.rglob("*") if f.is_file()}
        if current == payload:
            return False
    new_dir = Path(tempfile.mkdtemp(prefix=datetime.now(timezone.utc).strftime("..%Y_%m_%d_%H_%M_%S."), dir=target))
    new_dir.chmod(0o755)
    for rel, (content, mode) in payload.items():
        path = new_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    tmp_link = target / "..data_tmp"
    if tmp_link.is_symlink():
        tmp_link.unlink()
    os.symlink(new_dir.name, tmp_link)
    os.rename(tmp_link, data_link)
    visible = {rel.split("/")[0] for rel in payload}
    for entry in target.iterdir():
        if not entry.name.startswith("..") and entry.name not in visible:
            entry.unlink()
    for name in visible:
        if not (target / name).is_symlink():
            os.symlink(f"..data/{name}", target / name)
    if old_dir is not None:
        shutil.rmtree(old_dir, ignore_errors=True)
    return True


def key_files(data: dict[str, bytes], items: list[Obj] | None, mode: int, optional: bool, kind: str) -> dict[str, tuple[bytes, int]]:
    """The files of a Secret or ConfigMap projection: every key, or the listed items."""
    if not items:
        return {k: (v, mode) for k, v in data.items()}
    files = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise ConfigError(f"{kind} references non-existent {'config' if kind == 'configmap' else 'secret'} key: {item['key']}")
        files[item["path"]] = (data[item["key"]], item.get("mode", mode) & 0o777)
    return files


class PodVolumes:
    """A Pod's volumes as directories under its folder (the kubelet's pods/<uid>/volumes), kept
    current: Secret, ConfigMap, downward API and token files are rewritten atomically when their
    source changes."""

    def __init__(self, worker: PodWorker) -> None:
        self._worker = worker
        self._root = worker.dir / "volumes"
        self.ready = False  # set up once; after that a failed refresh keeps the old content

    def path(self, pod: Obj, name: str) -> Path:
        volume = next((v for v in pod["spec"].get("volumes") or [] if v["name"] == name), None)
        if volume is None:
            raise ConfigError(f'volume "{name}" is not defined in the Pod')
        if "hostPath" in volume:
            return Path(volume["hostPath"]["path"])
        return self._root / name

    @staticmethod
    def read_only(pod: Obj, name: str) -> bool:
        volume: Obj = next((v for v in pod["spec"].get("volumes") or [] if v["name"] == name), {})
        return any(kind in volume for kind in VOLUME_KINDS_READ_ONLY)

    def sync(self, pod: Obj, pod_ip: str) -> None:
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            kind = next((k for k in volume if k != "name"), "")
            try:
                if kind == "emptyDir":
                    (self._root / name).mkdir(parents=True, exist_ok=True)
                elif kind == "hostPath":
                    self._host_path(volume["hostPath"])
                elif kind in VOLUME_KINDS_READ_ONLY:
                    source = volume[kind]
                    mode = source.get("defaultMode", 0o644) & 0o777
                    files: dict[str, tuple[bytes, int]] = {}
                    for projection in source.get("sources") or [] if kind == "projected" else [{kind: source}]:
                        files |= self._projection(pod, projection, mode, pod_ip)
                    if write_atomically(self._root / name, files) and self.ready:
                        self._worker.log(f'volume "{name}" updated')
                else:
                    raise Unsupported(f"{kind} volumes are not supported by this node stand-in")
            except (ConfigError, Unsupported, ApiError, OSError) as e:
                raise ConfigError(f'MountVolume.SetUp failed for volume "{name}" : {e}') from e
        self.ready = True

    @staticmethod
    def _host_path(source: Obj) -> None:
        path, kind = Path(source["path"]), source.get("type") or ""
        if kind == "DirectoryOrCreate":
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)
        elif kind == "Directory" and not path.is_dir() or kind == "File" and not path.is_file():
            raise ConfigError(f"hostPath type check failed: {path} is not a {kind.lower()}")

    def _projection(self, pod: Obj, source: Obj, mode: int, pod_ip: str) -> dict[str, tuple[bytes, int]]:
        namespace = pod["metadata"]["namespace"]
        objects, node = self._worker.node.machine.objects, self._worker.node
        if (s := source.get("secret")) is not None:
            name = s.get("secretName") or s.get("name")
            data = objects.secret_data(namespace, name)
            if data is None:
                if s.get("optional"):
                    return {}
                raise ConfigError(f'secret "{name}" not found')
            return key_files(data, s.get("items"), mode, bool(s.get("optional")), "secret")
        if (s := source.get("configMap")) is not None:
            data = objects.config_map_data(namespace, s["name"])
            if data is None:
                if s.get("optional"):
                    return {}
                raise ConfigError(f'configmap "{s["name"]}" not found')
            return key_files(data, s.get("items"), mode, bool(s.get("optional")), "configmap")
        if (s := source.get("downwardAPI")) is not None:
            files = {}
            for item in s.get("items") or []:
                if "fieldRef" in item:
                    value = field_value(pod, item["fieldRef"]["fieldPath"], pod_ip, node.machine.host_ip)
                else:
                    value = resource_value(pod, item["resourceFieldRef"], "", node.allocatable)
                files[item["path"]] = (value.encode(), item.get("mode", mode) & 0o777)
            return files
        if (s := source.get("serviceAccountToken")) is not None:
            token = node.machine.tokens.token(pod, s.get("audience", ""), int(s.get("expirationSeconds", 3600)))
            return {s["path"]: (token, mode)}
        raise Unsupported(f"{next(iter(source), 'empty')} projections are not supported by this node stand-in")

    def remove(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Container processes


def processes_in_mount_ns(inode: int) -> list[int]:
    """Every live process in one mount namespace: a container's processes, whatever their parent,
    session or process group (zombies have left their namespaces and do not count)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(f"/proc/{entry.name}/ns/mnt").st_ino == inode:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def kill_and_wait(pids: list[int], timeout: float = 10.0) -> None:
    """SIGKILL processes and wait until they are gone (through pidfds, so no PID is ever reused
    under us and nothing polls)."""
    fds = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            fds.append(fd)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while fds and time.monotonic() < deadline:
        ready, _, _ = select.select(fds, [], [], deadline - time.monotonic())
        for fd in ready:
            fds.remove(fd)
            os.close(fd)
    for fd in fds:
        os.close(fd)


class Process:
    """One run of a container: its main process (the PID that gets signalled, the child that gets
    reaped) and its mount namespace, which tells the rest of its processes."""

    def __init__(self, popen: subprocess.Popen[bytes], mntns: int | None, start_error: str | None,
                 image_id: str, env: dict[str, str], cwd: str) -> None:
        self.popen, self.pid, self.mntns, self.start_error = popen, popen.pid, mntns, start_error
        self.pidfd = os.pidfd_open(popen.pid)
        self.image_id, self.env, self.cwd = image_id, env, cwd
        self.started_at = time.time()
        self._lock = threading.Lock()  # signal() never races finish() closing the pidfd
        self.finished_at = 0.0
        self.finished_mono = 0.0
        self.exit_code = 0
        self.done = threading.Event()

    @property
    def container_id(self) -> str:
        return f"standin://{self.pid}"

    def signal(self, sig: int) -> None:
        with self._lock:
            if not self.done.is_set():
                try:
                    signal.pidfd_send_signal(self.pidfd, sig)
                except ProcessLookupError:
                    pass

    def kill_all(self) -> None:
        """SIGKILL the main process and every process left in the container's mount namespace."""
        self.signal(signal.SIGKILL)
        if self.mntns is not None and self.mntns != os.stat("/proc/self/ns/mnt").st_ino:
            for _ in range(10):  # processes may still be forking: sweep until the namespace is empty
                pids = processes_in_mount_ns(self.mntns)
                if not pids:
                    break
                kill_and_wait(pids)

    def finish(self, returncode: int) -> None:
        self.exit_code = 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128+N
        self.finished_at, self.finished_mono = time.time(), time.monotonic()
        with self._lock:
            os.close(self.pidfd)
            self.done.set()

    def terminated(self) -> Obj:
        state = {"exitCode": self.exit_code,
                 "reason": "StartError" if self.start_error else ("Completed" if self.exit_code == 0 else "Error"),
                 "startedAt": rfc3339(self.started_at), "finishedAt": rfc3339(self.finished_at),
                 "containerID": self.container_id}
        if self.start_error:
            state["message"] = self.start_error
        return state


def _read_until_eof(fd: int, timeout: float) -> str | None:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                return b"".join(chunks).decode(errors="replace")
            chunks.append(chunk)
    return None


def spawn_container(netns: str, spec: Obj, log_path: Path, image_id: str) -> Process:
    """Start a container process in a Pod's network namespace, in new mount and UTS namespaces:
    ``nsenter`` and ``unshare`` exec each other and then the in-namespace step, which execs the
    command, so the PID returned is the container's main process. The step reports the mount
    namespace it made (and any error) on a close-on-exec pipe: EOF means the command runs."""
    read_fd, write_fd = os.pipe()
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        popen = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{netns}", "--", "unshare", "--mount", "--uts", "--propagation", "private",
             "--", sys.executable, "-I", "-S", str(Path(__file__).resolve()), EXEC_STEP, str(write_fd)],
            stdin=subprocess.PIPE, stdout=out, stderr=out, pass_fds=(write_fd,), start_new_session=True,
            env={"PATH": DEFAULT_PATH}, cwd="/")
    finally:
        os.close(write_fd)
        os.close(out)
    assert popen.stdin is not None
    try:
        popen.stdin.write(json.dumps(spec).encode())
        popen.stdin.close()
    except BrokenPipeError:
        pass  # it died before reading: the report below says why
    report = _read_until_eof(read_fd, timeout=30)
    os.close(read_fd)
    mntns, error = None, None
    if report is None:
        popen.kill()
        error = "the container's namespaces could not be set up within 30 s"
    else:
        for line in report.splitlines():
            word, _, rest = line.partition(" ")
            if word == "mntns":
                mntns = int(rest)
            elif word == "error":
                error = rest
        if mntns is None and error is None:
            error = f"the container's namespaces could not be entered (see {log_path})"
    return Process(popen, mntns, error, image_id, spec["env"], spec["cwd"])


def _exec_step(status_fd: int) -> NoReturn:
    """The step between ``unshare`` and the container's command, already inside the container's new
    mount and UTS namespaces: bind-mount the volumes, set the hostname and execve the command, so
    the PID stays the one the stand-in signals. Reads its spec on stdin, then puts /dev/null there."""
    os.set_inheritable(status_fd, False)
    status = os.fdopen(status_fd, "w", buffering=1)
    try:
        spec = json.loads(sys.stdin.buffer.read())
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
        libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
        libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)

        def check(rc: int, what: str) -> None:
            if rc != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"{what}: {os.strerror(err)}")

        # Die with the stand-in's thread that started us, even when it is killed without notice.
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        status.write(f"mntns {os.stat('/proc/self/ns/mnt').st_ino}\n")
        # Our copies of the other Pods' netns mounts would keep those namespaces alive after the
        # node deletes them.
        if os.path.ismount("/run/netns"):
            check(libc.umount2(b"/run/netns", MNT_DETACH), "umount /run/netns")
        for m in spec["mounts"]:
            target = m["target"]
            if not os.path.lexists(target):
                if m["file"]:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    open(target, "a").close()
                else:
                    os.makedirs(target)
            check(libc.mount(m["source"].encode(), target.encode(), None, MS_BIND | MS_REC, None),
                  f"mount {m['source']} at {target}")
            if m["readOnly"]:
                check(libc.mount(None, target.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None),
                      f"remount {target} read-only")
        socket.sethostname(spec["hostname"])
        os.makedirs(spec["cwd"], exist_ok=True)
        os.chdir(spec["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        argv, env = spec["argv"], spec["env"]
        path = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", DEFAULT_PATH))
        if path is None:
            raise OSError(errno.ENOENT, f'exec: "{argv[0]}": executable file not found in $PATH')
        os.execve(path, argv, env)
    except Exception as e:  # noqa: BLE001 - every failure becomes the container's StartError
        status.write(f"error {e}\n")
        os._exit(128)


# ---------------------------------------------------------------------------------------------
# Probes and lifecycle handlers


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
            done = subprocess.run(["nsenter", f"--target={proc.pid}", "--net", "--mount", "--uts", f"--wd={proc.cwd}",
                                   "--", *h["command"]], env=proc.env, capture_output=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
            output = (done.stdout + done.stderr)[:10 * 1024].decode(errors="replace")
            return done.returncode == 0, output
        if (h := handler.get("sleep")) is not None:
            proc.done.wait(min(float(h["seconds"]), timeout))
            return True, ""
    except subprocess.TimeoutExpired:
        return False, f"command {handler['exec']['command']!r} timed out"
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


# ---------------------------------------------------------------------------------------------
# Pods


@dataclass(eq=False)
class Container:
    """The kubelet's record of one container of a Pod, across its runs."""

    spec: Obj
    init: bool
    proc: Process | None = None  # the current run, or the last one
    last_state: Obj | None = None  # lastState.terminated: the run before ``proc``
    restarts: int = 0
    waiting: tuple[str, str] | None = None  # why it is not running (back-off, config or image error)
    started: bool = False  # the startup probe passed (or there is none)
    readiness_ok: bool = False
    stopping: bool = False  # a stop is under way: no restart decision until it ends
    stop_deadline: float = 0.0  # when that stop sends SIGKILL (monotonic)
    restart_after_kill: bool = False  # killed by a failed probe: restart unless restartPolicy is Never
    probes: list[Probe] = field(default_factory=list)
    retry_at: float = 0.0  # no start attempt before this (monotonic)
    backoff: float = 0.0
    backoff_updated: float | None = None
    image_failures: int = 0

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def running(self) -> bool:
        return self.proc is not None and not self.proc.done.is_set()

    @property
    def ready(self) -> bool:
        return self.running and self.started and (self.readiness_ok or "readinessProbe" not in self.spec)


def pod_phase(spec: Obj, init_statuses: list[Obj], statuses: list[Obj], terminal: bool) -> str:
    """The kubelet's getPhase."""
    policy = spec.get("restartPolicy", "Always")
    pending_init = failed_init = 0
    for s in init_statuses:
        state, last = s["state"], s["lastState"]
        if "terminated" in state:
            failed_init += state["terminated"]["exitCode"] != 0
        elif "waiting" in state and "terminated" in last:
            failed_init += last["terminated"]["exitCode"] != 0
        else:
            pending_init += 1
    running = waiting = stopped = succeeded = 0
    for s in statuses:
        state, last = s["state"], s["lastState"]
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            succeeded += state["terminated"]["exitCode"] == 0
        elif "terminated" in last:
            stopped += 1
        else:
            waiting += 1
    if failed_init and policy == "Never":
        return "Failed"
    if pending_init or waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if terminal:
            return "Succeeded" if stopped == succeeded else "Failed"
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        return "Failed" if policy == "Never" else "Running"
    return "Pending"


def with_deletions(status: Obj) -> Obj:
    """A Pod status as a strategic merge patch that also removes what the new status lacks, as the
    kubelet's computed patches do: conditions merge by type, so a reason or message left out would
    survive from the old status; podIPs/hostIPs merge by ip, so a new sandbox's IP would be added
    to the old one. (Container statuses are atomic lists: they are replaced whole anyway.)"""
    patch = dict(status)
    patch["conditions"] = [{"reason": None, "message": None} | c for c in status["conditions"]]
    for key in ("podIPs", "hostIPs"):
        if key in status:
            patch[key] = [{"$patch": "replace"}, *status[key]]
    return patch


class PodWorker:
    """Runs one Pod on one node, from its sandbox to its final DELETE: the kubelet's pod worker.

    Its own thread owns the Pod's lifecycle (``_run``); the container processes' waiter threads,
    the probes and the stop threads report to it under ``_cond``, and it turns their reports into
    starts, restarts and status patches. Network calls happen outside the lock, so a slow API server
    never delays a SIGKILL."""

    def __init__(self, node: Node, pod: Obj) -> None:
        self.node = node
        meta = pod["metadata"]
        self.uid, self.namespace, self.name = meta["uid"], meta["namespace"], meta["name"]
        self.ref = f"{self.name}_{self.namespace}({self.uid})"  # the kubelet's format.Pod
        self.dir = pod_dir(node.machine.workdir, self.namespace, self.name, self.uid)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._cond = threading.Condition(threading.RLock())
        self._pod, self._dirty, self._removed, self._shutdown = pod, True, False, False
        self._containers = [Container(c, True) for c in pod["spec"].get("initContainers") or []]
        self._containers += [Container(c, False) for c in pod["spec"]["containers"]]
        self._volumes = PodVolumes(self)
        self._sandbox: Sandbox | None = None
        self.pod_ip = ""
        self._start_time = ""
        self._blocked: tuple[str, str] | None = None  # why no container can start (Pod-level)
        self._terminal = False  # nothing runs and nothing will be started again
        self._adopted_terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        self._stopping = False
        self._transitions: dict[str, tuple[str, str]] = {}
        self._sent: Obj | None = None
        self._retry_at = 0.0
        self.thread = threading.Thread(target=self._run, name=f"pod {self.namespace}/{self.name}", daemon=True)

    # -- reports from other threads

    def update(self, pod: Obj) -> None:
        with self._cond:
            self._pod = pod
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            if self._stopping and grace is not None:
                self._shorten_stops(float(grace))
            self._wake()

    def removed(self, pod: Obj) -> None:
        """The Pod is gone from the API (force deletion): stop it with the grace it had then."""
        with self._cond:
            self._pod, self._removed = pod, True
            self._wake()

    def shutdown(self, grace: float) -> None:
        with self._cond:
            self._shutdown = True
            self._shorten_stops(grace)
            self._wake()

    def poke(self) -> None:
        """Something the Pod may use changed (a Secret, a ConfigMap): sync again."""
        with self._cond:
            self._wake()

    def _wake(self) -> None:
        self._dirty = True
        self._cond.notify_all()

    def _shorten_stops(self, grace: float) -> None:
        bound = time.monotonic() + max(grace, MIN_GRACE)
        for c in self._containers:
            if c.stopping and c.stop_deadline > bound:
                c.stop_deadline = bound
                self.log(f"container {c.name}: grace period shortened; SIGKILL in {max(grace, MIN_GRACE):.0f}s")

    def log(self, message: str) -> None:
        log.info("%s/%s: %s", self.namespace, self.name, message)
        with open(self.dir / "lifecycle.log", "a") as f:
            f.write(f"{micro_time()} {message}\n")

    def event(self, kind: str, reason: str, message: str, c: Container | None = None) -> None:
        self.node.machine.events.emit(self.node.name, self._pod, kind, reason, message,
                                      c.name if c else "", c.init if c else False)

    # -- the lifecycle

    def _run(self) -> None:
        try:
            self._live()
            self._terminate()
        except Exception:  # noqa: BLE001 - log, then still stop what runs
            log.exception("pod worker of %s/%s failed", self.namespace, self.name)
            for c in self._containers:
                if c.proc is not None:
                    c.proc.kill_all()
            self._teardown()
        finally:
            self.node.worker_done(self)

    def _live(self) -> None:
        """Keep the Pod's containers running until it is deleted or removed or the node stops."""
        while True:
            with self._cond:
                if not self._dirty:
                    self._cond.wait(self._next_wakeup())
                self._dirty = False
                pod = self._pod
                if self._removed or self._shutdown or pod["metadata"].get("deletionTimestamp"):
                    return
            try:
                self._sync(pod)
            except Exception:  # noqa: BLE001 - retry like the kubelet's pod worker does
                log.exception("syncing %s/%s failed; retrying in %.0f s", self.namespace, self.name, ERROR_RETRY)
                self._retry_at = time.monotonic() + ERROR_RETRY

    def _next_wakeup(self) -> float:
        now = time.monotonic()
        times = [now + SYNC_PERIOD] + [t for t in [self._retry_at] + [c.retry_at for c in self._containers] if t > now]
        return max(min(times) - now, 0.05)

    def _sync(self, pod: Obj) -> None:
        if self._terminal or self._adopted_terminal:
            if not self._adopted_terminal:
                self._publish(pod)
            return
        problem = unsupported_features(pod)
        if problem is not None:
            self._block("CreateContainerError", problem, "Failed")
        elif (self._sandbox is not None or self._create_sandbox(pod)) and self._sync_volumes(pod):
            self._start_containers(pod)
            with self._cond:
                done = self._all_done(pod)
            if done:
                self.log("all containers have finished and none will restart")
                self._terminal = True
                self._teardown()
        self._publish(pod)

    def _block(self, reason: str, message: str, event_reason: str) -> None:
        if self._blocked != (reason, message):
            self.log(f"cannot start: {message}")
            self.event("Warning", event_reason, message)
        self._blocked = (reason, message)
        self._retry_at = time.monotonic() + ERROR_RETRY

    def _create_sandbox(self, pod: Obj) -> bool:
        try:
            self._sandbox = self.node.network.create(self.uid)
        except Exception as e:  # noqa: BLE001 - reported, retried
            self._block("ContainerCreating", f"failed to create the Pod sandbox: {e}", "FailedCreatePodSandBox")
            return False
        self.pod_ip = self._sandbox.ip
        self._start_time = self._start_time or rfc3339()
        self.log(f"sandbox ready: netns {self._sandbox.netns}, IP {self.pod_ip}")
        return True

    def _sync_volumes(self, pod: Obj) -> bool:
        try:
            self._volumes.sync(pod, self.pod_ip)
        except (ConfigError, Unsupported, ApiError, OSError) as e:
            if not self._volumes.ready:
                self._block("ContainerCreating", str(e), "FailedMount")
                return False
            self.event("Warning", "FailedMount", str(e))  # the running containers keep the old content
        self._blocked = None
        return True

    def _start_containers(self, pod: Obj) -> None:
        policy = pod["spec"].get("restartPolicy", "Always")
        for c in self._containers:
            if not c.init:
                break
            if c.running or c.stopping:
                return
            if c.proc is not None and c.proc.exit_code == 0 and not c.proc.start_error:
                continue
            if c.proc is None or policy != "Never":
                self._try_start(pod, c)
            return
        for c in self._containers:
            if not c.init and not c.running and not c.stopping and (c.proc is None or self._restarts(c, policy)):
                self._try_start(pod, c)

    @staticmethod
    def _restarts(c: Container, policy: str) -> bool:
        assert c.proc is not None
        if policy == "Always":
            return True
        return policy == "OnFailure" and (c.proc.exit_code != 0 or c.restart_after_kill)

    def _all_done(self, pod: Obj) -> bool:
        policy = pod["spec"].get("restartPolicy", "Always")
        inits = [c for c in self._containers if c.init]
        if policy == "Never" and any(c.proc and c.proc.done.is_set() and c.proc.exit_code != 0 for c in inits):
            return not any(c.running or c.stopping for c in self._containers)
        return all(not c.running and not c.stopping and c.proc is not None and not self._restarts(c, policy)
                   for c in self._containers if not c.init)

    def _try_start(self, pod: Obj, c: Container) -> None:
        now = time.monotonic()
        if now < c.retry_at:
            return
        if c.proc is not None:  # a restart: the kubelet's crash-loop back-off (flowcontrol.Backoff)
            finished = c.proc.finished_mono
            expired = c.backoff_updated is None or finished - c.backoff_updated > 2 * BACKOFF_MAX
            if not expired and now - finished < c.backoff:
                message = f"back-off {c.backoff:.0f}s restarting failed container={c.name} pod={self.ref}"
                with self._cond:
                    c.waiting = ("CrashLoopBackOff", message)
                c.retry_at = finished + c.backoff
                self.event("Warning", "BackOff", f"Back-off restarting failed container {c.name} in pod {self.ref}", c)
                self.log(f"container {c.name}: {message}")
                return
            c.backoff = BACKOFF_INITIAL if expired else min(c.backoff * 2, BACKOFF_MAX)
            c.backoff_updated = now
        image = self.node.machine.image(c.spec["image"])
        if image is None:
            c.image_failures += 1
            c.retry_at = now + min(BACKOFF_INITIAL * 2 ** (c.image_failures - 1), BACKOFF_MAX)
            message = (f'Failed to pull image "{c.spec["image"]}": this node stand-in has no image named '
                       f'"{image_name(c.spec["image"])}" (known: {", ".join(sorted(self.node.machine.images)) or "none"})')
            with self._cond:
                c.waiting = ("ErrImagePull" if c.image_failures == 1 else "ImagePullBackOff", message)
            self.event("Warning", "Failed", message, c)
            self.log(f"container {c.name}: {message}")
            return
        self.event("Normal", "Pulled", f'Container image "{c.spec["image"]}" already present on machine', c)
        try:
            spec = self._process_spec(pod, c, image)
        except (ConfigError, Unsupported, ApiError, ValueError) as e:
            with self._cond:
                c.waiting = ("CreateContainerConfigError", str(e))
            c.retry_at = now + ERROR_RETRY
            self.event("Warning", "Failed", f"Error: {e}", c)
            self.log(f"container {c.name}: CreateContainerConfigError: {e}")
            return
        assert self._sandbox is not None
        proc = spawn_container(self._sandbox.netns, spec, self.dir / f"{c.name}.log", image.image_id())
        with self._cond:
            if c.proc is not None:
                c.last_state = c.proc.terminated()
                c.restarts += 1
            c.proc, c.waiting, c.readiness_ok, c.restart_after_kill = proc, None, False, False
            c.started = "startupProbe" not in c.spec
        self.node.machine.track(proc)
        threading.Thread(target=self._reap, args=(c, proc), name=f"reaper {c.name}", daemon=True).start()
        if proc.start_error:
            self.event("Warning", "Failed", f"Error: {proc.start_error}", c)
            self.log(f"container {c.name}: StartError: {proc.start_error}")
            return
        self.event("Normal", "Created", f"Created container: {c.name}", c)
        self.event("Normal", "Started", f"Started container {c.name}", c)
        self.log(f"container {c.name}: started, pid {proc.pid}: {json.dumps(spec['argv'])[:300]}")
        with self._cond:
            for kind in ("startup", "liveness", "readiness"):
                if f"{kind}Probe" in c.spec and not c.init:
                    c.probes.append(Probe(self, c, proc, kind, c.spec[f"{kind}Probe"]))
        hook = (c.spec.get("lifecycle") or {}).get("postStart")
        if hook:
            ok, output = run_handler(hook, c.spec, proc, self.pod_ip, self._grace_for(pod, c))
            if not ok:
                self.event("Warning", "FailedPostStartHook", f"PostStartHook failed: {output}", c)
                self._kill_async(pod, c, proc, f"Container {c.name} failed its postStart hook, will be restarted")

    def _process_spec(self, pod: Obj, c: Container, image: Image) -> Obj:
        env = self._env(pod, c.spec)
        lookup = env.get
        command = [expand(a, lookup) for a in c.spec.get("command") or []]
        args = [expand(a, lookup) for a in c.spec.get("args") or []]
        if command and command[0] in (image.name, image.binary.name):
            command[0] = str(image.binary)
        argv = (command or [str(image.binary)]) + args
        mounts = []
        for vm in c.spec.get("volumeMounts") or []:
            source = self._volumes.path(pod, vm["name"])
            sub = vm.get("subPath") or expand(vm.get("subPathExpr") or "", lookup)
            if ".." in Path(sub).parts or sub.startswith("/"):
                raise ConfigError(f"subPath {sub!r} must be a relative path inside the volume")
            if sub:
                source = source / sub
                if not os.path.lexists(source):
                    source.mkdir(parents=True)  # the kubelet creates a missing subPath as a directory
                source = source.resolve()
            mounts.append({"source": str(source), "target": vm["mountPath"], "file": not source.is_dir(),
                           "readOnly": bool(vm.get("readOnly")) or self._volumes.read_only(pod, vm["name"])})
        mounts.sort(key=lambda m: len(Path(m["target"]).parts))
        targets = [Path(m["target"]) for m in mounts]
        for m, target in zip(mounts, targets):
            if not any(other in target.parents for other in targets):  # else it lives inside that volume
                self.node.machine.mount_points.acquire(self.uid, target, m["file"])
        hostname = pod["spec"].get("hostname") or self.name
        return {"argv": argv, "env": {"PATH": DEFAULT_PATH, "HOSTNAME": hostname} | env, "mounts": mounts,
                "hostname": hostname, "cwd": c.spec.get("workingDir") or "/"}

    def _env(self, pod: Obj, spec: Obj) -> dict[str, str]:
        """The kubelet's makeEnvironmentVariables: envFrom, then env (with $(VAR) expansion over the
        variables declared so far and the service variables), then the service variables."""
        machine, namespace = self.node.machine, self.namespace
        machine.objects.services.synced.wait(30)
        service_env = service_link_env("kubernetes", machine.api_host, [{"name": "https", "port": machine.api_port}])
        if pod["spec"].get("enableServiceLinks", True):
            for svc in machine.objects.services.items():
                ip, ports = svc["spec"].get("clusterIP"), svc["spec"].get("ports") or []
                if svc["metadata"]["namespace"] == namespace and ip and ip != "None" and ports and not (
                        namespace == "default" and svc["metadata"]["name"] == "kubernetes"):  # see the module docstring
                    service_env |= service_link_env(svc["metadata"]["name"], ip, ports)
        sources: dict[tuple[str, str], dict[str, bytes] | None] = {}

        def source(kind: str, name: str) -> dict[str, bytes] | None:
            if (kind, name) not in sources:
                get = machine.objects.secret_data if kind == "secret" else machine.objects.config_map_data
                sources[(kind, name)] = get(namespace, name)
            return sources[(kind, name)]

        env: dict[str, str] = {}
        for ef in spec.get("envFrom") or []:
            kind, ref = ("configmap", ef["configMapRef"]) if "configMapRef" in ef else ("secret", ef["secretRef"])
            data = source(kind, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind} "{ref["name"]}" not found')
            env |= {ef.get("prefix", "") + k: v.decode(errors="replace") for k, v in data.items()}
        for var in spec.get("env") or []:
            value_from = var.get("valueFrom")
            if var.get("value") or not value_from:
                env[var["name"]] = expand(var.get("value", ""), lambda n: env.get(n, service_env.get(n)))
            elif "fieldRef" in value_from:
                env[var["name"]] = field_value(pod, value_from["fieldRef"]["fieldPath"], self.pod_ip, machine.host_ip)
            elif "resourceFieldRef" in value_from:
                env[var["name"]] = resource_value(pod, value_from["resourceFieldRef"], spec["name"], self.node.allocatable)
            elif "configMapKeyRef" in value_from or "secretKeyRef" in value_from:
                kind, ref = (("configmap", value_from["configMapKeyRef"]) if "configMapKeyRef" in value_from
                             else ("secret", value_from["secretKeyRef"]))
                data = source(kind, ref["name"])
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    if data is None:
                        raise ConfigError(f'{kind} "{ref["name"]}" not found')
                    label = "ConfigMap" if kind == "configmap" else "Secret"
                    raise ConfigError(f"couldn't find key {ref['key']} in {label} {namespace}/{ref['name']}")
                env[var["name"]] = data[ref["key"]].decode(errors="replace")
            else:
                raise Unsupported(f"env {var['name']}: {next(iter(value_from))} is not supported by this node stand-in")
        return env | {k: v for k, v in service_env.items() if k not in env}

    # -- reports: exits, probes

    def _reap(self, c: Container, proc: Process) -> None:
        """Wait for a container's main process; what it leaves behind goes with it."""
        returncode = proc.popen.wait()
        proc.kill_all()
        with self._cond:
            proc.finish(returncode)
            for probe in c.probes:
                probe.stop()
            c.probes = []
            c.started = False
            self._wake()
        self.node.machine.untrack(proc)
        if not proc.start_error:
            self.log(f"container {c.name} (pid {proc.pid}) exited with code {proc.exit_code}")

    def probe_result(self, probe: Probe, ok: bool, output: str) -> None:
        c, kind, spec = probe.container, probe.kind, probe.spec
        with self._cond:
            if probe.stopped.is_set() or c.proc is not probe.proc or c.stopping:
                return
            probe.successes, probe.failures = (probe.successes + 1, 0) if ok else (0, probe.failures + 1)
            if not ok:
                self.event("Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {output}".rstrip(), c)
            failed = probe.failures >= int(spec.get("failureThreshold", 3))
            if kind == "readiness":
                ready = probe.successes >= int(spec.get("successThreshold", 1)) or (c.readiness_ok and not failed)
                if ready != c.readiness_ok:
                    c.readiness_ok = ready
                    self.log(f"container {c.name}: readiness probe {'succeeded' if ready else 'failed'}")
                    self._wake()
            elif kind == "startup" and ok:
                c.started = True
                probe.stop()
                self.log(f"container {c.name}: startup probe succeeded")
                for other in c.probes:
                    other.trigger()
                self._wake()
            elif failed:
                message = f"Container {c.name} failed {kind} probe, will be restarted"
                self._kill_async(self._pod, c, probe.proc, message, probe_grace=spec.get("terminationGracePeriodSeconds"))

    # -- stopping

    def _grace_for(self, pod: Obj, c: Container, probe_grace: int | None = None) -> float:
        if probe_grace is not None:
            return float(probe_grace)
        return float(pod["spec"].get("terminationGracePeriodSeconds", 30))

    def _kill_async(self, pod: Obj, c: Container, proc: Process, message: str, probe_grace: int | None = None) -> None:
        with self._cond:
            if c.stopping or proc.done.is_set():
                return
            c.stopping, c.restart_after_kill = True, True
        self.log(message)
        threading.Thread(target=self._stop_container, args=(c, proc, self._grace_for(pod, c, probe_grace), message, True),
                         name=f"stop {c.name}", daemon=True).start()

    def _stop_container(self, c: Container, proc: Process, grace: float, message: str, pre_stop: bool) -> None:
        """Stop one container run as the kubelet's killContainer does: Killing event, preStop hook
        (within the grace period), SIGTERM to the main process, SIGKILL to all of it once the rest
        of the grace period (never under 2 s) has passed."""
        with self._cond:
            c.stopping = True
            for probe in c.probes:
                probe.stop()
        self.event("Normal", "Killing", message, c)
        begin = time.monotonic()
        hook = (c.spec.get("lifecycle") or {}).get("preStop")
        if pre_stop and hook and grace > 0 and not proc.done.is_set():
            self.log(f"container {c.name}: running the preStop hook (up to {grace:.0f}s)")
            ok, output = run_handler(hook, c.spec, proc, self.pod_ip, grace)
            if not ok:
                self.event("Warning", "FailedPreStopHook", f"PreStopHook failed: {output}", c)
            self.log(f"container {c.name}: preStop hook {'done' if ok else 'failed: ' + output} after {time.monotonic() - begin:.1f}s")
        remaining = max(grace - int(time.monotonic() - begin), MIN_GRACE)
        with self._cond:
            c.stop_deadline = time.monotonic() + remaining
            if self._shutdown:
                c.stop_deadline = min(c.stop_deadline, time.monotonic() + self.node.machine.shutdown_grace)
        if not proc.done.is_set():
            self.log(f"container {c.name}: SIGTERM to pid {proc.pid}; SIGKILL in {remaining:.0f}s at {micro_time(time.time() + remaining)}")
            proc.signal(signal.SIGTERM)
        with self._cond:
            while not proc.done.is_set() and (left := c.stop_deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            exited, left = proc.done.is_set(), c.stop_deadline - time.monotonic()
        if exited:
            self.log(f"container {c.name}: exited with code {proc.exit_code}, {left:.1f}s before the SIGKILL deadline")
        else:
            self.log(f"container {c.name}: grace period over; SIGKILL to its processes")
            proc.kill_all()
            proc.done.wait()
            self.log(f"container {c.name}: killed, exit code {proc.exit_code}")
        with self._cond:
            c.stopping = False
            self._wake()

    def _terminate(self) -> None:
        """Deletion, removal from the API, or the node stopping: stop every container in parallel,
        tear the sandbox down, publish the final status and (on deletion) finish it with a DELETE."""
        with self._cond:
            pod, shutdown, removed = self._pod, self._shutdown, self._removed
            self._stopping = True
            meta = pod["metadata"]
            if shutdown:
                grace, why = self.node.machine.shutdown_grace, "the node is stopping"
            else:
                grace = float(meta["deletionGracePeriodSeconds"] if meta.get("deletionGracePeriodSeconds") is not None
                              else pod["spec"].get("terminationGracePeriodSeconds", 30))
                why = "the Pod was removed from the API" if removed else f"deletion requested at {meta.get('deletionTimestamp')}"
            running = [(c, c.proc) for c in self._containers if c.running and c.proc is not None]
            for c in self._containers:
                for probe in c.probes:
                    probe.stop()
                if c.stopping:
                    c.stop_deadline = min(c.stop_deadline, time.monotonic() + max(grace, MIN_GRACE))
        self.log(f"{why}: stopping {len(running)} container(s) with a grace period of {grace:.0f}s")
        stops = [threading.Thread(target=self._stop_container, args=(c, p, grace, f"Stopping container {c.name}", not shutdown),
                                  name=f"stop {c.name}", daemon=True) for c, p in running]
        for t in stops:
            t.start()
        for t in stops:
            t.join()
        with self._cond:
            while any(c.stopping for c in self._containers):  # a probe-triggered stop still under way
                self._cond.wait()
        self._terminal = True
        self._teardown()
        if shutdown or removed or self._adopted_terminal and not meta.get("deletionTimestamp"):
            return
        for _ in range(10):
            if self._adopted_terminal or self._publish(pod, final=True) or self.node.machine.stop.wait(2):
                break
        if meta.get("deletionTimestamp"):
            self._delete()

    def _teardown(self) -> None:
        if self._sandbox is not None:
            self.node.network.destroy(self._sandbox)
            self.log(f"sandbox {self._sandbox.netns} removed")
            self._sandbox = None
        self._volumes.remove()
        self.node.machine.mount_points.release(self.uid)
        self.node.machine.tokens.forget(self.uid)

    def _delete(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        self.log("finishing the deletion: DELETE with gracePeriodSeconds=0 and the Pod's UID as precondition")
        for attempt in range(30):
            try:
                self.node.machine.api.request("DELETE", path, body)
                return
            except ApiError as e:
                if e.status in (404, 409):
                    self.log(f"the Pod was already gone (HTTP {e.status})")
                    return
                log.warning("deleting %s/%s failed: %s", self.namespace, self.name, e)
            except Exception as e:  # noqa: BLE001 - the API server may be restarting
                log.warning("deleting %s/%s failed: %s", self.namespace, self.name, e)
            if self.node.machine.stop.wait(min(2.0 ** attempt, 30)):
                return

    # -- status

    def _publish(self, pod: Obj, final: bool = False) -> bool:
        """Patch the Pod's status if it changed (the uid in the patch is the kubelet's precondition);
        returns False when it should be tried again."""
        with self._cond:
            status = self._status(pod, final)
        if status == self._sent:
            return True
        try:
            self.node.machine.api.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
                                          {"metadata": {"uid": self.uid}, "status": with_deletions(status)},
                                          patch="strategic")
            self._sent = status
            return True
        except ApiError as e:
            if e.status in (404, 409):
                log.info("status of %s/%s not written: the Pod is gone (HTTP %d)", self.namespace, self.name, e.status)
                return True
            log.warning("status of %s/%s not written: %s", self.namespace, self.name, e)
        except Exception as e:  # noqa: BLE001 - the API server may be restarting
            log.warning("status of %s/%s not written: %s", self.namespace, self.name, e)
        self._retry_at = time.monotonic() + ERROR_RETRY
        return False

    def _container_status(self, c: Container, initializing: bool, final: bool) -> Obj:
        s: Obj = {"name": c.name, "image": c.spec["image"], "imageID": "", "ready": c.ready,
                  "restartCount": c.restarts, "started": c.running and c.started, "state": {}, "lastState": {}}
        p = c.proc
        if p is not None:
            s["imageID"], s["containerID"] = p.image_id, p.container_id
        if p is not None and not p.done.is_set():
            s["state"] = {"running": {"startedAt": rfc3339(p.started_at)}}
            s["lastState"] = {"terminated": c.last_state} if c.last_state else {}
        elif p is not None and (c.waiting is None or final):
            s["state"] = {"terminated": p.terminated()}
            s["lastState"] = {"terminated": c.last_state} if c.last_state else {}
        elif final:  # the kubelet's TerminatePod: a container that never ended is reported as lost
            s["state"] = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                         "message": "The container could not be located when the pod was terminated"}}
        else:
            reason, message = c.waiting or self._blocked or (("PodInitializing", "") if initializing and not c.init
                                                             else ("ContainerCreating", ""))
            s["state"] = {"waiting": {"reason": reason} | ({"message": message} if message else {})}
            s["lastState"] = {"terminated": p.terminated()} if p is not None else {}
        return s

    def _status(self, pod: Obj, final: bool) -> Obj:
        inits = [c for c in self._containers if c.init]
        initializing = any(not (c.proc and c.proc.done.is_set() and c.proc.exit_code == 0 and not c.proc.start_error) for c in inits)
        init_st = [self._container_status(c, initializing, final) for c in inits]
        st = [self._container_status(c, initializing, final) for c in self._containers if not c.init]
        phase = pod_phase(pod["spec"], init_st, st, self._terminal)
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            phase = pod["status"]["phase"]  # a terminal phase never changes
        elif final and phase not in ("Succeeded", "Failed"):
            phase = "Failed"
        status: Obj = {"phase": phase, "hostIP": self.node.machine.host_ip,
                       "hostIPs": [{"ip": self.node.machine.host_ip}], "containerStatuses": st,
                       "conditions": self._conditions(pod, init_st, st, phase),
                       "observedGeneration": pod["metadata"].get("generation", 1)}
        if init_st:
            status["initContainerStatuses"] = init_st
        if self.pod_ip:
            status |= {"podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}]}
        if self._start_time:
            status["startTime"] = self._start_time
        return status

    def _conditions(self, pod: Obj, init_st: list[Obj], st: list[Obj], phase: str) -> list[Obj]:
        def names(items: list[str]) -> str:
            return "[" + " ".join(items) + "]"

        incomplete = [s["name"] for s in init_st if s["state"].get("terminated", {}).get("exitCode") != 0]
        any_started = any("running" in s["state"] or "terminated" in s["state"] or s["lastState"] for s in st)
        if phase == "Succeeded" or any_started or not incomplete:
            initialized = ("True", "PodCompleted" if phase == "Succeeded" and init_st else "", "")
        else:
            initialized = ("False", "ContainersNotInitialized", f"containers with incomplete status: {names(incomplete)}")
        unready = [s["name"] for s in st if not s["ready"]]
        if phase in ("Succeeded", "Failed"):
            containers_ready = ("False", "PodCompleted" if phase == "Succeeded" else "PodFailed", "")
        elif unready:
            containers_ready = ("False", "ContainersNotReady", f"containers with unready status: {names(unready)}")
        else:
            containers_ready = ("True", "", "")
        ready = containers_ready
        if ready[0] == "True":
            existing = {c["type"]: c for c in pod.get("status", {}).get("conditions") or []}
            for gate in pod["spec"].get("readinessGates") or []:
                kind = gate["conditionType"]
                if kind not in existing:
                    ready = ("False", "ReadinessGatesNotReady", f'corresponding condition of pod readiness gate "{kind}" does not exist.')
                elif existing[kind].get("status") != "True":
                    ready = ("False", "ReadinessGatesNotReady",
                             f'the status of pod readiness gate "{kind}" is not "True", but {existing[kind].get("status")}')
        sandbox = ("True" if self._sandbox is not None else "False", "", "")
        out = []
        for kind, (value, reason, message) in (("PodReadyToStartContainers", sandbox), ("Initialized", initialized),
                                                ("Ready", ready), ("ContainersReady", containers_ready)):
            if self._transitions.get(kind, ("",))[0] != value:
                self._transitions[kind] = (value, rfc3339())
            condition = {"type": kind, "status": value, "lastTransitionTime": self._transitions[kind][1],
                         "observedGeneration": pod["metadata"].get("generation", 1)}
            out.append(condition | ({"reason": reason} if reason else {}) | ({"message": message} if message else {}))
        return out


# ---------------------------------------------------------------------------------------------
# Nodes and the machine they share


def image_name(image: str) -> str:
    """The last path component of an image's repository: ``registry:5000/x/astro-agent:1.2`` ->
    ``astro-agent``."""
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


@dataclass
class Image:
    """A binary standing in for an image whose entrypoint it is."""

    name: str
    binary: Path
    _digest: tuple[float, int, str] | None = None

    def image_id(self) -> str:
        stat = self.binary.stat()
        if self._digest is None or self._digest[:2] != (stat.st_mtime, stat.st_size):
            digest = hashlib.sha256(self.binary.read_bytes()).hexdigest()
            self._digest = (stat.st_mtime, stat.st_size, digest)
        return f"{self.name}@sha256:{self._digest[2]}"


class Machine:
    """What the nodes of this process share: the API client, the Secret/ConfigMap/Service caches,
    the Event sender, the token issuer, the host's mount points and the images."""

    def __init__(self, args: argparse.Namespace, stop: threading.Event) -> None:
        self.stop = stop
        self.api = KubeApi(args.kubeconfig)
        server = urlsplit(self.api.server)
        self.api_host, self.api_port = server.hostname or args.host_ip, server.port or 443
        self.host_ip, self.workdir, self.shutdown_grace = args.host_ip, args.workdir, args.shutdown_grace
        self.images = {name: Image(name, Path(path).resolve()) for name, _, path in (i.partition("=") for i in args.image)}
        self.events = EventRecorder(self.api)
        self.tokens = Tokens(self.api)
        self.mount_points = MountPoints()
        self.nodes: list[Node] = []
        self.objects = ClusterObjects(self.api, self._object_changed)
        self._processes: set[Process] = set()
        self._lock = threading.Lock()

    def image(self, ref: str) -> Image | None:
        return self.images.get(image_name(ref))

    def _object_changed(self, _kind: str, obj: Obj) -> None:
        for node in self.nodes:
            node.poke_namespace(obj["metadata"].get("namespace", ""))

    def track(self, proc: Process) -> None:
        with self._lock:
            self._processes.add(proc)

    def untrack(self, proc: Process) -> None:
        with self._lock:
            self._processes.discard(proc)

    def kill_leftovers(self) -> None:
        with self._lock:
            leftovers = list(self._processes)
        for proc in leftovers:
            log.warning("killing leftover container process %d", proc.pid)
            proc.kill_all()


@dataclass
class NodeSpec:
    name: str
    capacity: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Obj] = field(default_factory=list)


class Node:
    """One Node this process stands in for: registration, Lease, status, and a worker for each Pod
    bound to it (watched with the kubelet's fieldSelector spec.nodeName=NAME)."""

    def __init__(self, machine: Machine, spec: NodeSpec, index: int, cidr_base: str, labels: dict[str, str],
                 taints: list[Obj]) -> None:
        self.machine, self.name, self.taints = machine, spec.name, taints + spec.taints
        self.cidr = f"{cidr_base}.{index}.0/24"
        self.network = PodNetwork(self.name, f"{cidr_base}.{index}", machine.host_ip)
        disk = os.statvfs(machine.workdir)
        self.capacity = spec.capacity | {"ephemeral-storage": str(disk.f_blocks * disk.f_frsize)}
        self.allocatable = {k: parse_quantity(v) for k, v in self.capacity.items()}
        self.labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": _arch(), "beta.kubernetes.io/os": "linux",
                       "beta.kubernetes.io/arch": _arch()} | labels | spec.labels
        self._lock = threading.Lock()
        self._workers: dict[str, PodWorker] = {}
        self._finished: dict[str, None] = {}  # UIDs whose worker ended: late events must not revive them
        self._uid: str | None = None
        self._registered_at = rfc3339()
        self.pods = Informer(machine.api, "/api/v1/pods", field_selector=f"spec.nodeName={self.name}",
                             on_change=self._on_pod)

    def start(self) -> None:
        self.network.remove_stale()
        threading.Thread(target=self._heartbeat, name=f"node {self.name}", daemon=True).start()
        self.pods.start(self.machine.stop)

    # -- Pods

    def _on_pod(self, kind: str, pod: Obj) -> None:
        uid = pod["metadata"].get("uid", "")
        with self._lock:
            worker = self._workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    worker.removed(pod)
            elif worker is not None:
                worker.update(pod)
            elif uid not in self._finished and not self.machine.stop.is_set():
                worker = PodWorker(self, pod)
                self._workers[uid] = worker
                worker.log(f"bound to node {self.name}")
                worker.thread.start()

    def worker_done(self, worker: PodWorker) -> None:
        with self._lock:
            self._workers.pop(worker.uid, None)
            self._finished[worker.uid] = None
            if len(self._finished) > 10000:
                self._finished.pop(next(iter(self._finished)))

    def poke_namespace(self, namespace: str) -> None:
        with self._lock:
            workers = [w for w in self._workers.values() if w.namespace == namespace]
        for worker in workers:
            worker.poke()

    def stop(self) -> None:
        """Stop every container (SIGTERM, the shutdown grace, SIGKILL) and remove the sandboxes;
        the API objects stay as they are, as when a real kubelet stops."""
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.shutdown(self.machine.shutdown_grace)
        for worker in workers:
            worker.thread.join(self.machine.shutdown_grace + 20)
        self.network.remove_stale()

    # -- registration, Lease and status

    def _heartbeat(self) -> None:
        next_status = 0.0
        while not self.machine.stop.is_set():
            try:
                if self._uid is None:
                    self._register()
                self._renew_lease()
                if time.monotonic() >= next_status:
                    self.machine.api.request("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": self._status()}, patch="merge")
                    next_status = time.monotonic() + NODE_STATUS_PERIOD
            except Exception as e:  # noqa: BLE001 - keep trying; the node lifecycle controller notices
                log.warning("heartbeat of node %s failed: %s", self.name, e)
                if isinstance(e, ApiError) and e.status == 404:
                    self._uid = None  # the Node was deleted: register again, as a kubelet does
            self.machine.stop.wait(LEASE_PERIOD)

    def _register(self) -> None:
        api = self.machine.api
        metadata = {"name": self.name, "labels": self.labels,
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                    "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}
        try:
            node = api.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": metadata,
                                                         "spec": {"podCIDR": self.cidr, "podCIDRs": [self.cidr],
                                                                  "taints": self.taints},
                                                         "status": self._status()})
        except ApiError as e:
            if e.status != 409:
                raise
            node = api.request("PATCH", f"/api/v1/nodes/{self.name}", {"metadata": metadata}, patch="merge")
            if node["spec"].get("podCIDR", self.cidr) != self.cidr:
                log.warning("node %s keeps its podCIDR %s; Pods get IPs of %s", self.name, node["spec"]["podCIDR"], self.cidr)
        self._uid = node["metadata"]["uid"]
        log.info("node %s registered (podCIDR %s, capacity %s)", self.name, self.cidr, self.capacity)

    def _renew_lease(self) -> None:
        api, path = self.machine.api, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_DURATION, "renewTime": micro_time()}
        try:
            api.request("PATCH", f"{path}/{self.name}", {"spec": spec}, patch="merge")
        except ApiError as e:
            if e.status != 404:
                raise
            api.request("POST", path, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec,
                "metadata": {"name": self.name, "namespace": "kube-node-lease", "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self._uid}]}})

    def _status(self) -> Obj:
        now = rfc3339()

        def condition(kind: str, status: str, reason: str, message: str) -> Obj:
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": self._registered_at}

        return {
            "capacity": self.capacity, "allocatable": self.capacity,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status")],
            "addresses": [{"type": "InternalIP", "address": self.machine.host_ip}, {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": _read("/etc/machine-id"), "systemUUID": hashlib.md5(self.name.encode()).hexdigest(),
                         "bootID": _read("/proc/sys/kernel/random/boot_id"), "kernelVersion": platform.release(),
                         "osImage": _os_image(), "containerRuntimeVersion": f"standin://{KUBELET_VERSION}",
                         "kubeletVersion": KUBELET_VERSION, "operatingSystem": "linux", "architecture": _arch()}}


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "Linux"


# ---------------------------------------------------------------------------------------------
# Command line


def _taint(text: str) -> Obj:
    key_value, _, effect = text.rpartition(":")
    key, _, value = key_value.partition("=")
    if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise argparse.ArgumentTypeError(f"taint {text!r} is not KEY[=VALUE]:EFFECT")
    return {"key": key, "effect": effect} | ({"value": value} if value else {})


def _node_spec(text: str, defaults: dict[str, str]) -> NodeSpec:
    name, _, overrides = text.partition(":")
    spec = NodeSpec(name, dict(defaults))
    for item in filter(None, overrides.split(",")):
        key, _, value = item.partition("=")
        if key == "label":
            label, _, label_value = value.partition("=")
            spec.labels[label] = label_value
        elif key == "taint":
            spec.taints.append(_taint(value))
        elif key in spec.capacity:
            spec.capacity[key] = value
        else:
            raise argparse.ArgumentTypeError(f"--node {text}: unknown item {key!r} (cpu, memory, pods, label, taint)")
    for value in spec.capacity.values():
        parse_quantity(value)
    return spec


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Run the Pods bound to the given Nodes as local processes (a kubelet stand-in).")
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--node", action="append", required=True,
                   metavar="NAME[:cpu=N,memory=Q,pods=N,label=KEY=VALUE,taint=KEY[=VALUE]:EFFECT]",
                   help="a Node to register and run Pods for; repeatable; after a colon: capacity overrides, "
                        "and labels and taints of this node only (each repeatable)")
    p.add_argument("--cpu", default="2", help="default cpu capacity of each node")
    p.add_argument("--memory", default="8Gi", help="default memory capacity of each node")
    p.add_argument("--pods", default="20", help="default Pod capacity of each node")
    p.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE", help="a label of every node")
    p.add_argument("--register-with-taints", default="", metavar="KEY[=VALUE]:EFFECT,...",
                   help="taints every node registers with (as the kubelet's flag of that name)")
    p.add_argument("--pod-cidr-base", default="10.244", help="the i-th node (from 0) gets BASE.i.0/24")
    p.add_argument("--host-ip", default="10.200.0.1", help="the node's InternalIP, the Pods' gateway")
    p.add_argument("--workdir", type=Path, required=True, help="Pod folders (logs, volumes) go under WORKDIR/pods")
    p.add_argument("--image", action="append", default=[], metavar="NAME=PATH",
                   help="run images whose repository ends in NAME with the binary PATH as entrypoint")
    p.add_argument("--shutdown-grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL for the containers when this process stops")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    defaults = {"cpu": args.cpu, "memory": args.memory, "pods": args.pods}
    try:
        args.nodes = [_node_spec(n, defaults) for n in args.node]
    except (argparse.ArgumentTypeError, ValueError) as e:
        p.error(str(e))
    for image in args.image:
        name, sep, path = image.partition("=")
        if not sep or not name or not os.access(path, os.X_OK):
            p.error(f"--image {image}: expected NAME=PATH to an executable")
    args.labels = dict(label.partition("=")[::2] for label in args.node_label)
    try:
        args.taints = [_taint(t) for t in filter(None, args.register_with_taints.split(","))]
    except argparse.ArgumentTypeError as e:
        p.error(f"--register-with-taints: {e}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03dZ %(levelname)s %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
    logging.Formatter.converter = time.gmtime
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            log.error("%s is missing: it is needed to build Pod sandboxes", tool)
            return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    machine = Machine(args, stop)
    machine.nodes = [Node(machine, spec, i, args.pod_cidr_base, args.labels, args.taints) for i, spec in enumerate(args.nodes)]
    machine.objects.start(stop)
    for node in machine.nodes:
        node.start()
    log.info("running Pods for node(s) %s; images: %s", ", ".join(n.name for n in machine.nodes),
             ", ".join(f"{i.name}={i.binary}" for i in machine.images.values()) or "none")
    stop.wait()
    log.info("stopping: every container gets SIGTERM, then SIGKILL after %.0f s", args.shutdown_grace)
    stoppers = [threading.Thread(target=node.stop) for node in machine.nodes]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()
    machine.kill_leftovers()
    machine.mount_points.release()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == EXEC_STEP:
        _exec_step(int(sys.argv[2]))
    sys.exit(main(sys.argv[1:]))
