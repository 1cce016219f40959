"""The pre-forked launcher's spares follow demand (``SpareDemand`` in agent/python/astro_launcher.py),
on a controllable clock: none before the first start or after a long idle, as many as the largest
recent burst of starts, never more than the slots allow."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[2] / "agent" / "python" / "astro_launcher.py"


@pytest.fixture(scope="module")
def launcher():
    # The launcher imports only the standard library at module level (Airflow in main()).
    spec = importlib.util.spec_from_file_location("astro_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def starts(demand, clock, count: int, gap: float) -> None:
    for _ in range(count):
        demand.started()
        clock.advance(gap)


def test_a_worker_that_never_started_a_task_keeps_no_spare(launcher):
    clock = Clock()
    demand = launcher.SpareDemand(4, clock)
    assert demand.wanted() == 0
    assert demand.seconds_to_next_change() is None


def test_a_burst_wants_as_many_spares_as_it_started_tasks_up_to_the_most(launcher):
    clock = Clock()
    demand = launcher.SpareDemand(4, clock)
    starts(demand, clock, 3, gap=0.1)
    assert demand.wanted() == 3
    starts(demand, clock, 3, gap=0.1)  # the same burst goes on: 6 starts, capped at 4
    assert demand.wanted() == 4


def test_starts_a_quiet_gap_apart_are_separate_bursts_and_the_largest_counts(launcher):
    clock = Clock()
    demand = launcher.SpareDemand(8, clock)
    starts(demand, clock, 4, gap=0.1)
    clock.advance(launcher.SPARE_AFTER_QUIET)
    starts(demand, clock, 1, gap=launcher.SPARE_AFTER_QUIET)  # one task at a time, 1 s apart
    starts(demand, clock, 1, gap=0)
    assert demand.wanted() == 4


def test_demand_lapses_a_window_after_the_last_start_of_its_burst(launcher):
    clock = Clock()
    demand = launcher.SpareDemand(4, clock)
    starts(demand, clock, 2, gap=0.5)  # last start at 1000.5; the clock is at 1001.0
    assert demand.seconds_to_next_change() == pytest.approx(launcher.DEMAND_WINDOW - 0.5)
    clock.advance(launcher.DEMAND_WINDOW - 0.6)
    assert demand.wanted() == 2
    clock.advance(0.1)  # exactly DEMAND_WINDOW after the last start
    assert demand.wanted() == 0
    assert demand.seconds_to_next_change() is None


def test_an_older_larger_burst_gives_way_to_a_recent_smaller_one(launcher):
    clock = Clock()
    demand = launcher.SpareDemand(4, clock)
    starts(demand, clock, 4, gap=0)
    clock.advance(launcher.DEMAND_WINDOW / 2)
    starts(demand, clock, 1, gap=0)
    clock.advance(launcher.DEMAND_WINDOW / 2)
    assert demand.wanted() == 1
    assert demand.seconds_to_next_change() == pytest.approx(launcher.DEMAND_WINDOW / 2)
