"""Outages of the shared infrastructure, for the chaos scenarios marked ``alone`` (they run when
no other scenario does, since every scenario shares what they break):

* ``kube-apiserver``: stopped for ``down`` seconds, then started again (etcd keeps the objects);
* ``keda``: KEDA's operator and metrics API server stopped and started again.

Only the process that started a daemon stops and starts it again (by PID): the driver
(``infra/driver.py``) when the stage shares its infrastructure -- asked through a request file
beside the state file and SIGUSR1, answering in a done file -- else the scenario's own process,
in a thread. :func:`begin` returns at once; :meth:`Outage.wait` returns once the component
serves again (or raises what went wrong), with the moment its processes had exited.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from harness.procs import wait_for

COMPONENTS = ("kube-apiserver", "keda")


def perform(control_plane: Any, keda: Any, component: str, down: float) -> float:
    """The outage itself, by the process that started ``component``; the moment
    (``time.time()``) its processes had exited."""
    if component == "kube-apiserver":
        return control_plane.restart_apiserver(down)
    if component == "keda":
        return keda.restart(down)
    raise ValueError(f"unknown component {component!r}: one of {COMPONENTS}")


def request_path(state: Path) -> Path:
    return state.with_suffix(".outage")


def done_path(state: Path) -> Path:
    return state.with_suffix(".outage-done")


class Outage:
    """One outage under way."""

    def __init__(self, component: str, state: Path | None, thread: threading.Thread | None):
        self.component, self._state, self._thread = component, state, thread
        self._error: BaseException | None = None
        self._exited: float | None = None

    def wait(self, timeout: float = 300.0) -> float:
        """Returns once the component serves again: the moment its processes had exited."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"{self.component} not back within {timeout:.0f} s")
            if self._error is not None:
                raise self._error
            assert self._exited is not None
            return self._exited
        assert self._state is not None
        done = wait_for(lambda: done_path(self._state).exists() and done_path(self._state).read_text(),
                        timeout, f"{self.component} back (the driver's answer)", interval=0.5)
        done_path(self._state).unlink()
        answer = json.loads(done)
        if answer.get("error"):
            raise RuntimeError(f"the driver could not restart {self.component}: {answer['error']}")
        return answer["exited"]


def begin(control_plane: Any, keda: Any, component: str, down: float) -> Outage:
    """Starts the outage of ``component`` (``down`` seconds without it) and returns at once."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}: one of {COMPONENTS}")
    state = os.environ.get("ASTRO_CLUSTER_STATE")
    if state:
        path = Path(state)
        request_path(path).write_text(json.dumps({"component": component, "down": down}))
        os.kill(int(json.loads(path.read_text())["driver_pid"]), signal.SIGUSR1)
        return Outage(component, path, None)

    outage = Outage(component, None, None)

    def run() -> None:
        try:
            outage._exited = perform(control_plane, keda, component, down)
        except BaseException as e:  # noqa: BLE001 - raised again by wait()
            outage._error = e

    outage._thread = threading.Thread(target=run, name=f"outage-{component}", daemon=True)
    outage._thread.start()
    return outage
