"""The order in which a Pod's containers stop: the kubelet's terminationOrdering.

Every container of a stopping Pod is stopped at once, each on its own thread, within the one grace
period. A sidecar (a restartable init container) gets its SIGTERM only once every app container
has ended and the sidecar declared after it has ended too: sidecars stop after the app containers,
in reverse declaration order. Its preStop hook does not wait: the kubelet runs it first, then
waits for the container's turn, then signals."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from standin.spec import is_sidecar

if TYPE_CHECKING:
    from standin.common import Obj


class TerminationOrder:
    """Which containers each container waits for before its SIGTERM, and which have ended."""

    def __init__(self, pod_spec: Obj, running: Iterable[str]) -> None:
        self._cond = threading.Condition()
        apps = [c["name"] for c in pod_spec["containers"]]
        # A container that does not run has nothing to stop: nobody waits for it.
        self._ended = {c["name"] for c in pod_spec["containers"] + (pod_spec.get("initContainers") or [])} - set(running)
        self._waits_for: dict[str, list[str]] = {}
        later_sidecar: str | None = None
        for c in reversed(pod_spec.get("initContainers") or []):
            if is_sidecar(c):
                self._waits_for[c["name"]] = apps + ([later_sidecar] if later_sidecar else [])
                later_sidecar = c["name"]

    def pending(self, name: str) -> list[str]:
        """The containers ``name`` still waits for."""
        with self._cond:
            return [other for other in self._waits_for.get(name, []) if other not in self._ended]

    def wait_for_turn(self, name: str, timeout: float) -> float:
        """Wait until every container ``name`` waits for has ended, at most ``timeout`` seconds;
        returns how long that took."""
        begin = time.monotonic()
        deadline = begin + timeout
        with self._cond:
            while self.pending(name) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
        return time.monotonic() - begin

    def ended(self, name: str) -> None:
        with self._cond:
            self._ended.add(name)
            self._cond.notify_all()
