"""Pod sandboxes (a network namespace and a veth each), the host's mount points and Pod volumes."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from standin.api import ApiError
from standin.common import VOLUME_KINDS_READ_ONLY, log
from standin.process import kill_and_wait
from standin.spec import ConfigError, Unsupported, field_value, resource_value

if TYPE_CHECKING:
    from standin.common import Obj
    from standin.pod import PodWorker


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

    Removing a mount point detaches it in every mount namespace, so the claims of every stand-in
    on the machine (the cluster stage runs two at once, one per instance of its infrastructure)
    are kept in one registry under ``registry``, changed under a file lock: a path made for a Pod
    of one stand-in stays while a Pod of any stand-in uses it. Each made path has an entry there
    (a folder holding the path and one file per claim, ``<stand-in PID>.<Pod UID>``); the claims
    of a stand-in that is gone (killed) do not count."""

    def __init__(self, registry: Path = Path("/run/astro-standin/mount-points")) -> None:
        self._registry = registry

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._registry.mkdir(parents=True, exist_ok=True)
        with open(self._registry / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _entry(self, path: Path) -> Path:
        return self._registry / hashlib.sha256(str(path).encode()).hexdigest()[:32]

    def acquire(self, owner: str, target: Path, is_file: bool) -> None:
        with self._locked():
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
                entry = self._entry(path)
                entry.mkdir(exist_ok=True)
                (entry / "path").write_text(str(path))
            for path in [target, *target.parents]:
                entry = self._entry(path)
                if entry.is_dir():
                    (entry / f"{os.getpid()}.{owner}").touch()

    def release(self, owner: str | None = None) -> None:
        """Drop one owner's claims (all of this stand-in's when ``owner`` is None); remove what no
        stand-in uses."""
        mine = f"{os.getpid()}.{owner}" if owner else f"{os.getpid()}."
        with self._locked():
            entries = [(Path((e / "path").read_text()), e) for e in self._registry.iterdir()
                       if e.is_dir() and (e / "path").is_file()]
            for path, entry in sorted(entries, key=lambda pe: -len(pe[0].parts)):
                claims = [c for c in entry.iterdir() if c.name != "path"]
                for claim in claims:
                    if (claim.name == mine if owner else claim.name.startswith(mine)) or not _alive(claim.name):
                        claim.unlink()
                if any(c.name != "path" for c in entry.iterdir()):
                    continue
                try:
                    path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.warning("could not remove mount point %s: %s", path, e)
                shutil.rmtree(entry, ignore_errors=True)


def _alive(claim: str) -> bool:
    """Whether the stand-in that made a claim (``<PID>.<Pod UID>``) still runs."""
    try:
        os.kill(int(claim.split(".", 1)[0]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


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
        self._claimed: dict[str, Path] = {}  # volume name -> the bound PersistentVolume's path
        self.ready = False  # set up once; after that a failed refresh keeps the old content

    def path(self, pod: Obj, name: str) -> Path:
        volume = next((v for v in pod["spec"].get("volumes") or [] if v["name"] == name), None)
        if volume is None:
            raise ConfigError(f'volume "{name}" is not defined in the Pod')
        if "hostPath" in volume:
            return Path(volume["hostPath"]["path"])
        if "persistentVolumeClaim" in volume:
            return self._claimed[name]
        return self._root / name

    @staticmethod
    def read_only(pod: Obj, name: str) -> bool:
        volume: Obj = next((v for v in pod["spec"].get("volumes") or [] if v["name"] == name), {})
        claim_read_only = bool((volume.get("persistentVolumeClaim") or {}).get("readOnly"))
        return claim_read_only or any(kind in volume for kind in VOLUME_KINDS_READ_ONLY)

    def sync(self, pod: Obj, pod_ip: str) -> None:
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            kind = next((k for k in volume if k != "name"), "")
            try:
                if kind == "emptyDir":
                    (self._root / name).mkdir(parents=True, exist_ok=True)
                elif kind == "hostPath":
                    self._host_path(volume["hostPath"])
                elif kind == "persistentVolumeClaim":
                    if name not in self._claimed:  # bound once: a PersistentVolume's path does not move
                        claim = volume[kind]["claimName"]
                        path = Path(self._worker.node.machine.objects.claimed_path(pod["metadata"]["namespace"], claim))
                        path.mkdir(parents=True, exist_ok=True)  # a local/hostPath PV's folder, as provisioned
                        self._claimed[name] = path
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
