"""Kubernetes API access: the client, informers, Events, and the caches and tokens the Pods use."""

from __future__ import annotations

import base64
import json
import queue
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from standin.common import KUBELET_VERSION, log, rfc3339
from standin.spec import ConfigError, Unsupported

if TYPE_CHECKING:
    from standin.common import Obj


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

    def claimed_path(self, namespace: str, claim: str) -> str:
        """Where a PersistentVolumeClaim's data lives on this machine: the hostPath or local path
        of the PersistentVolume it is bound to (the only volume sources a node of this stand-in
        can reach). Raises ConfigError while the claim is missing or unbound, as the kubelet keeps
        a Pod's containers waiting until its volumes can be mounted."""
        try:
            pvc = self._api.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        except ApiError as e:
            if e.status == 404:
                raise ConfigError(f'persistentvolumeclaim "{claim}" not found') from e
            raise
        volume = (pvc.get("spec") or {}).get("volumeName")
        if (pvc.get("status") or {}).get("phase") != "Bound" or not volume:
            raise ConfigError(f'persistentvolumeclaim "{claim}" is not bound')
        spec = self._api.request("GET", f"/api/v1/persistentvolumes/{volume}").get("spec") or {}
        for kind in ("hostPath", "local"):
            if kind in spec:
                return spec[kind]["path"]
        raise Unsupported(f'persistentvolume "{volume}" is neither hostPath nor local')

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
