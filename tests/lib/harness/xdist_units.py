"""Handing pytest-xdist's processes whole work units, as late as possible.

The e2e and cluster stages run tests side by side, and some tests must share a process (one
queue, one release, one cluster-wide object). xdist's ``xdist_group`` marks do not take with
pytest 9, so each stage's conftest names its units itself and returns :func:`unit_scheduler`
from ``pytest_xdist_make_scheduler``.

xdist hands a process its next unit when two of its tests are left: that unit then waits behind
them while another process may be free sooner. Here a process gets its next unit when one test
is left, as late as it can be (it runs its last test only once it knows what comes next, or is
told to stop).
"""

from __future__ import annotations

from typing import Callable


def unit_scheduler(config, log, unit_of: Callable[[str], str], rank: Callable[[str], int] | None = None):
    """A scheduler whose work units are ``unit_of(nodeid)``, handed out in collection order, or
    lowest ``rank(unit)`` first when given."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            if rank is not None:
                first = min(self.workqueue, key=rank)
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if node.shutting_down or self._pending_of(self.assigned_work[node]) > 1:
                return
            # One test left: hand over the next unit, or tell the process to stop (with fewer
            # units than processes that is at once for some, and must wait for their last test
            # for the others: a process told to stop earlier drops the tests it holds).
            if self.workqueue:
                self._assign_work_unit(node)
            else:
                node.shutdown()

    return UnitScheduling(config, log)
