"""Headroom in the chart (`keda.overprovisionSlots`): the value reaches the Sentinel's
configuration, a third metrics-api trigger reads the Sentinel's `scalingSlots` (same URL, auth
and target per replica as the backlog trigger), none with external-push (whose gRPC metric holds
the headroom already), none at 0, and values that cannot work are refused naming the key."""

from __future__ import annotations

from conftest import effective, scenario, sentinel_config

WORKER = "astro-worker-default-worker"
HEADROOM = "workers[0].keda.overprovisionSlots=8"


def _worker_config(r) -> dict:
    values, _ = effective("keda-static")
    (entry,) = [w for w in sentinel_config(r, values)["workers"] if w["name"] == WORKER]
    return entry


def test_headroom_reaches_the_sentinel_and_a_trigger_reads_the_scaling_slots(chart, validate):
    r = chart.render(scenario("keda-static"), sets=[HEADROOM])
    so = r.get("ScaledObject", WORKER)
    validate(so)
    backlog, pre_warm, headroom = so["spec"]["triggers"]
    assert (backlog["name"], pre_warm["name"]) == ("backlog", "pre-warm")
    assert headroom["name"] == "headroom" and headroom["type"] == "metrics-api"
    assert headroom["metricType"] == "AverageValue"
    md, bmd = headroom["metadata"], backlog["metadata"]
    assert md["valueLocation"] == "scalingSlots"
    for key in ("url", "format", "targetValue", "authModes"):
        assert md[key] == bmd[key], key
    # The work alone wakes the pool: with work, scalingSlots is that work plus the headroom.
    assert float(md["activationTargetValue"]) == float(bmd["activationTargetValue"]) + 8
    assert headroom["authenticationRef"] == backlog["authenticationRef"]
    assert _worker_config(r)["overprovisionSlots"] == 8


def test_the_headroom_triggers_activation_follows_a_fractional_one(chart):
    r = chart.render(scenario("keda-static"), sets=[HEADROOM, "workers[0].keda.activationTargetValue=0.5"])
    (headroom,) = [t for t in r.get("ScaledObject", WORKER)["spec"]["triggers"] if t["name"] == "headroom"]
    assert headroom["metadata"]["activationTargetValue"] == "8.5"


def test_no_headroom_no_trigger_and_an_unchanged_sentinel_config(chart):
    r = chart.render(scenario("keda-static"))
    assert [t["name"] for t in r.get("ScaledObject", WORKER)["spec"]["triggers"]] == ["backlog", "pre-warm"]
    assert "overprovisionSlots" not in _worker_config(r)


def test_external_push_carries_the_headroom_in_its_own_metric(chart):
    r = chart.render(scenario("keda-static"), sets=[HEADROOM, "workers[0].keda.trigger=external-push"])
    assert [t["type"] for t in r.get("ScaledObject", WORKER)["spec"]["triggers"]] == ["external-push"]
    assert _worker_config(r)["overprovisionSlots"] == 8


def test_headroom_the_pool_cannot_hold_is_refused_naming_the_key(chart):
    # keda-static: syncSlots 20, maxReplicaCount 10.
    full = chart.render_error(scenario("keda-static"), sets=["workers[0].keda.overprovisionSlots=200"])
    assert "workers[0].keda.overprovisionSlots is 200: it must be below" in full, full
    negative = chart.render_error(scenario("keda-static"), sets=["workers[0].keda.overprovisionSlots=-1"])
    assert "overprovisionSlots" in negative, negative
