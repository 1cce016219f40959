"""What KEDA's operator read from each trigger, from its own Prometheus metrics (the operator's
metrics port, :attr:`infra.keda_components.Ports.operator_metrics`):

* ``keda_scaler_metrics_value``: the value the scale loop got at its last read of a trigger, or
  the one its fallback made up (fallback replicas x target) while the trigger fails;
* ``keda_scaler_http_requests_total``: the HTTP requests a trigger's scaler made, by status
  (``200``, ``503``, ... or ``error`` when no answer came). A read that fails is retried once
  with a new scaler, so it makes two failed requests. (``keda_scaler_detail_errors_total`` is
  no count of failed reads: KEDA 2.21's scale loop records it with the error of another call,
  so only the HPA's reads, none while a pool is at zero, count there.)

They are labelled by namespace, ScaledObject and trigger name (the chart names its backlog
trigger ``backlog``). The operator sets the gauge at every poll and keeps it until the next one,
so :class:`KedaReadings`, which scrapes four times a second, sees every value a trigger read at
a ``pollingInterval`` of 1 s or more. It keeps going while the operator is away (a restart
starts its counters again from 0).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

VALUE = "keda_scaler_metrics_value"
HTTP_REQUESTS = "keda_scaler_http_requests_total"
BACKLOG_TRIGGER = "backlog"

_SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)(?: \d+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Trigger:
    namespace: str
    scaled_object: str
    name: str


@dataclass(frozen=True)
class Reading:
    at: float  # time.time() of the scrape that saw it
    trigger: Trigger
    value: float


@dataclass
class Scrape:
    values: dict[Trigger, float] = field(default_factory=dict)
    answered: dict[Trigger, float] = field(default_factory=dict)  # HTTP requests answered 200
    failed: dict[Trigger, float] = field(default_factory=dict)  # any other status, or no answer


def parse(text: str) -> Scrape:
    """The values and the HTTP requests of every ScaledObject trigger in one scrape."""
    out = Scrape()
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in (VALUE, HTTP_REQUESTS):
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        if m.group(1) == HTTP_REQUESTS:
            trigger = Trigger(labels["namespace"], labels["scaled_resource"], labels["trigger_name"])
            counts = out.answered if labels.get("status_code") == "200" else out.failed
            counts[trigger] = counts.get(trigger, 0.0) + float(m.group(3))
        elif labels.get("type") == "scaledobject":
            out.values[Trigger(labels["namespace"], labels["scaledObject"], labels["scaler"])] = float(m.group(3))
    return out


class KedaReadings(threading.Thread):
    """Scrapes the operator's metrics every ``interval`` seconds until :meth:`stop`.

    Keeps each trigger's last value and request counts, and every scrape in which a trigger read
    above 0; ``on_above_zero`` (if given) is called with each of those readings, in this thread.
    """

    def __init__(self, metrics_url: str, interval: float = 0.25,
                 on_above_zero: Callable[[Reading], None] | None = None):
        super().__init__(daemon=True, name="keda-readings")
        self.metrics_url, self.interval, self._on_above_zero = metrics_url, interval, on_above_zero
        self._lock = threading.Lock()
        self._values: dict[Trigger, float] = {}
        self._answered: dict[Trigger, float] = {}
        self._failed: dict[Trigger, float] = {}
        self._above_zero: list[Reading] = []
        self._scrapes = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
                    text = r.read().decode()
            except OSError:  # the operator is restarting, or the stage is stopping
                self._halt.wait(self.interval)
                continue
            at = time.time()
            scrape = parse(text)
            above = [Reading(at, t, v) for t, v in scrape.values.items() if v > 0]
            with self._lock:
                self._values.update(scrape.values)
                self._answered.update(scrape.answered)
                self._failed.update(scrape.failed)
                self._above_zero.extend(above)
                self._scrapes += 1
            if self._on_above_zero is not None:
                for reading in above:
                    self._on_above_zero(reading)
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def scrapes(self) -> int:
        with self._lock:
            return self._scrapes

    def value(self, trigger: Trigger) -> float | None:
        """The trigger's last value, None before KEDA has read it."""
        with self._lock:
            return self._values.get(trigger)

    def answered(self, trigger: Trigger) -> float:
        """The trigger's HTTP requests answered 200 (since the operator last started)."""
        with self._lock:
            return self._answered.get(trigger, 0.0)

    def failed(self, trigger: Trigger) -> float:
        """The trigger's HTTP requests that failed (since the operator last started)."""
        with self._lock:
            return self._failed.get(trigger, 0.0)

    def above_zero(self, trigger: Trigger) -> list[Reading]:
        with self._lock:
            return [r for r in self._above_zero if r.trigger == trigger]
