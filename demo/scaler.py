"""The demo's local scaler: what KEDA and the HPA do in a cluster, for processes on one machine.

In Kubernetes nothing here runs: KEDA reads the Sentinel and drives an HPA, and the HPA sets
the worker Deployment's replicas. Outside a cluster this class makes the same decisions so the
demo can start and stop ``astro-agent`` processes the way the cluster would start and stop Pods.

Rules, evaluated once per polling interval (KEDA's ``pollingInterval``) from the Sentinel's
``backlog`` (queued + running task instances on the worker's queues):

1. **No answer** (Sentinel 503 or unreachable): keep the current count, zero included (KEDA
   without a fallback, which the chart renders for pools that scale to zero; the Sentinel never
   answers a made-up 0).
2. **Activation from zero** (KEDA): at 0 workers, a backlog above ``activation`` (0) starts
   one worker; from then on rule 3 applies.
3. **Target** (HPA, ``AverageValue`` = ``syncSlots``): ``wanted = ceil(backlog / syncSlots)``
   held between ``max(min, 1)`` and ``max``. Scale-up is immediate (scale-up stabilization 0).
4. **Scale-down stabilization** (HPA ``behavior.scaleDown.stabilizationWindowSeconds``): the
   count only falls to the highest ``wanted`` seen during the trailing window.
5. **Cooldown to zero** (KEDA ``cooldownPeriod``): with ``min == 0``, once the backlog has been
   at or below ``activation`` for ``cooldown`` seconds, go to 0.

Removing a worker is a SIGTERM to its process (a Pod deletion): the worker leaves the count at
once and drains in the background, as a terminating Pod does.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class ScalerConfig:
    sync_slots: int
    min_replicas: int = 0
    max_replicas: int = 3
    polling_interval: float = 1.0
    cooldown: float = 5.0
    stabilization: float = 5.0
    activation: float = 0.0


@dataclass
class Decision:
    replicas: int  # the count the scaler wants now
    wanted: int | None  # ceil(backlog / syncSlots) clamped, or None without data
    reason: str  # one line for the live view ('' when nothing changed)


@dataclass
class LocalScaler:
    config: ScalerConfig
    replicas: int = 0
    _history: deque = field(default_factory=deque)  # (time, wanted) for the stabilization window
    _last_active: float | None = None

    def wanted(self, backlog: float) -> int:
        c = self.config
        raw = math.ceil(backlog / c.sync_slots) if backlog > 0 else 0
        return max(max(c.min_replicas, 1), min(c.max_replicas, raw))

    def decide(self, backlog: float | None, now: float | None = None) -> Decision:
        """One polling interval: the new replica count for ``backlog`` (None = no answer)."""
        c = self.config
        now = time.monotonic() if now is None else now
        if backlog is None:
            return Decision(self.replicas, None, "")
        active = backlog > c.activation
        if active:
            self._last_active = now
        wanted = self.wanted(backlog)
        self._history.append((now, wanted))
        while self._history and self._history[0][0] < now - c.stabilization:
            self._history.popleft()

        old = self.replicas
        if old == 0:
            if active:
                self.replicas = max(c.min_replicas, 1)
                return Decision(self.replicas, wanted, f"activation: backlog {backlog:g} > {c.activation:g} at 0 workers -> 1")
            self.replicas = c.min_replicas
            return Decision(self.replicas, wanted, "" if self.replicas == old else f"min {c.min_replicas}")

        if c.min_replicas == 0 and not active:
            idle_for = now - self._last_active if self._last_active is not None else math.inf
            if idle_for >= c.cooldown:
                self.replicas = 0
                self._history.clear()
                return Decision(0, wanted, f"cooldown: backlog {backlog:g} for {c.cooldown:g}s -> 0 workers")

        if wanted > old:
            self.replicas = wanted
            return Decision(wanted, wanted, f"scale up: ceil({backlog:g} / {c.sync_slots}) -> {wanted} (max {c.max_replicas})")
        # Scale-down: the highest recommendation within the window (the window includes now).
        stabilized = max(w for _, w in self._history)
        if stabilized < old:
            self.replicas = stabilized
            return Decision(stabilized, wanted, f"scale down: highest wanted over the last {c.stabilization:g}s is {stabilized}")
        return Decision(old, wanted, "")
