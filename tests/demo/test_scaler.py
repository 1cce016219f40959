"""The demo's local scaler follows the KEDA + HPA rules its docstring and the README state."""

from __future__ import annotations

from scaler import LocalScaler, ScalerConfig


def scaler(**kw) -> LocalScaler:
    cfg = dict(sync_slots=4, min_replicas=0, max_replicas=5, cooldown=30, stabilization=60)
    cfg.update(kw)
    return LocalScaler(ScalerConfig(**cfg))


def test_stays_at_zero_without_backlog_and_activates_to_one():
    s = scaler()
    assert s.decide(0, now=0).replicas == 0
    d = s.decide(17, now=1)
    assert d.replicas == 1 and d.reason.startswith("activation")
    assert s.decide(17, now=2).replicas == 5  # ceil(17/4) = 5


def test_target_is_ceil_backlog_over_slots_held_at_max():
    s = scaler(max_replicas=3)
    s.decide(5, now=0)
    assert s.decide(5, now=1).replicas == 2
    assert s.decide(100, now=2).replicas == 3


def test_no_answer_keeps_the_pool():
    s = scaler()
    s.decide(20, now=0)
    s.decide(20, now=1)
    assert s.decide(None, now=500).replicas == 5


def test_scale_down_waits_for_the_stabilization_window():
    s = scaler(stabilization=60, cooldown=1000)
    s.decide(20, now=0)
    assert s.decide(20, now=1).replicas == 5
    assert s.decide(4, now=30).replicas == 5  # 5 was recommended 29 s ago
    assert s.decide(4, now=61.5).replicas == 1  # the 5s have left the window
    assert s.decide(0, now=62).replicas == 1  # min 0, but cooldown not over: max(min, 1)


def test_cooldown_to_zero_after_the_last_active_backlog():
    s = scaler(stabilization=0, cooldown=30)
    s.decide(8, now=0)
    s.decide(8, now=1)
    assert s.decide(0, now=10).replicas == 1
    assert s.decide(0, now=30.9).replicas == 1
    d = s.decide(0, now=31)
    assert d.replicas == 0 and d.reason.startswith("cooldown")
    assert s.decide(3, now=32).replicas == 1  # activation again


def test_min_replicas_above_zero_never_cools_down():
    s = scaler(min_replicas=2, stabilization=0, cooldown=0)
    assert s.decide(0, now=0).replicas == 2
    s.decide(40, now=1)
    assert s.decide(0, now=100).replicas == 2
