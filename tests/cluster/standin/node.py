"""Nodes and the machine they share: registration, Lease and status, the images, the Pod workers."""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit
from typing import TYPE_CHECKING

from standin.api import ApiError, ClusterObjects, EventRecorder, Informer, KubeApi, Tokens
from standin.common import KUBELET_VERSION, LEASE_DURATION, LEASE_PERIOD, NODE_STATUS_PERIOD, log, micro_time, rfc3339
from standin.pod import PodWorker
from standin.sandbox import MountPoints, PodNetwork
from standin.spec import image_name, parse_quantity

if TYPE_CHECKING:
    from standin.common import Obj
    from standin.process import Process


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
