"""What every part of the stand-in shares: the object type, the kubelet's constants and timings,
and where a Pod's files go (also for tests: ``container_log_path``, ``lifecycle_log_path``)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from standin.exec_step import DEFAULT_PATH  # noqa: F401  (the PATH of every container)


Obj = dict[str, Any]

KUBELET_VERSION = "v1.37.2"
MIN_GRACE = 2.0  # the kubelet never gives a container less than 2 s to stop
BACKOFF_INITIAL, BACKOFF_MAX = 10.0, 300.0  # crash-loop and image-pull back-off
SYNC_PERIOD = 60.0  # the kubelet's syncFrequency: volumes and tokens are refreshed at least this often
ERROR_RETRY = 10.0  # the pod worker's back-off after a failed sync (config errors, mount failures)
LEASE_PERIOD, LEASE_DURATION = 10.0, 40
NODE_STATUS_PERIOD = 60.0
VOLUME_KINDS_READ_ONLY = ("secret", "configMap", "downwardAPI", "projected")  # always mounted ro

log = logging.getLogger("node-standin")


def rfc3339(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pods_root(workdir: Path) -> Path:
    """The folder of every Pod's folder (containers do not see it: it holds their volumes)."""
    return Path(workdir) / "pods"


def pod_dir(workdir: Path, namespace: str, pod: str, uid: str) -> Path:
    """The folder of one Pod: its containers' logs, its lifecycle log and its volumes."""
    return pods_root(workdir) / f"{namespace}_{pod}_{uid}"


def _newest_pod_dir(workdir: Path, namespace: str, pod: str) -> Path:
    # Namespace and Pod names are DNS labels/subdomains: they never contain "_".
    dirs = [d for d in pods_root(workdir).glob(f"{namespace}_{pod}_*") if d.name.count("_") == 2]
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
