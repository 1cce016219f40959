"""What every pytest stage shares (tests/run.sh and the stage scripts run pytest from here).

SIGTERM (a CI timeout, or a stage script's trap) tears a session down as Ctrl-C does, so that
fixtures stop the processes their tests started. Under pytest-xdist the controlling process
passes the signal on to its workers once and lets them tear down and report back (xdist would
kill a worker still busy 15 s after being told to exit); a second SIGTERM interrupts it too.
"""

from __future__ import annotations

import os
import signal

import pytest

_xdist_workers: list = []
_workers_told = False


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _on_sigterm)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist, in the controlling process, before each worker starts: keep its process."""
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)
    if popen is not None:
        _xdist_workers.append(popen)


def _on_sigterm(signum, frame):
    if _tell_workers():
        return
    raise KeyboardInterrupt(f"signal {signum}")


def _tell_workers() -> bool:
    """SIGTERM to each running xdist worker, once; False if there was none (or they were told
    before). A worker takes it as Ctrl-C: its fixtures stop what the test started, it reports
    the interruption, and the session ends once every worker has done so."""
    global _workers_told
    if _workers_told:
        return False
    workers = [w for w in _xdist_workers if w.poll() is None]
    for w in workers:
        try:
            os.kill(w.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    _workers_told = bool(workers)
    return _workers_told
