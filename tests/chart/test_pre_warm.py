"""Pre-warm from the schedule in the chart: on by default for KEDA workers, a second metrics-api
trigger on the Sentinel's `expectedSlots` (same URL, auth and target per replica as the backlog
trigger), the worker's `preWarm` settings in the Sentinel's configuration, and none of it with
`external-push` (whose gRPC metric already carries the larger of backlog and expected slots)."""

from __future__ import annotations

from conftest import scenario, sentinel_config, effective

WORKER = "astro-worker-default-worker"


def test_a_keda_worker_gets_the_pre_warm_trigger_beside_the_backlog_one(chart, validate):
    r = chart.render(scenario("keda-static"))
    so = r.get("ScaledObject", WORKER)
    validate(so)
    backlog, pre_warm = so["spec"]["triggers"]
    assert pre_warm["name"] == "pre-warm" and pre_warm["type"] == "metrics-api"
    assert pre_warm["metricType"] == "AverageValue"
    md, bmd = pre_warm["metadata"], backlog["metadata"]
    assert md["valueLocation"] == "expectedSlots" and bmd["valueLocation"] == "backlog"
    for key in ("url", "format", "targetValue", "activationTargetValue", "authModes"):
        assert md[key] == bmd[key], key
    assert pre_warm["authenticationRef"] == backlog["authenticationRef"]
    values, _ = effective("keda-static")
    (entry,) = [w for w in sentinel_config(r, values)["workers"] if w["name"] == WORKER]
    assert entry["preWarm"] == {"enabled": True}


def test_settings_reach_the_sentinel_and_off_means_no_trigger(chart):
    r = chart.render(scenario("keda-static"), sets=["workers[0].preWarm.lead=45s", "workers[0].preWarm.maxSlots=8",
                                                    "sentinel.schedule.readInterval=2m"])
    values, _ = effective("keda-static")
    config = sentinel_config(r, values)
    (entry,) = [w for w in config["workers"] if w["name"] == WORKER]
    assert entry["preWarm"] == {"enabled": True, "lead": "45s", "maxSlots": 8}
    assert config["schedule"] == {"readInterval": "2m"}

    off = chart.render(scenario("keda-static"), sets=["workers[0].preWarm.enabled=false"])
    (trigger,) = off.get("ScaledObject", WORKER)["spec"]["triggers"]
    assert trigger["metadata"]["valueLocation"] == "backlog"
    (entry,) = [w for w in sentinel_config(off, values)["workers"] if w["name"] == WORKER]
    assert entry["preWarm"] == {"enabled": False}


def test_bad_settings_are_refused_naming_the_key(chart):
    assert "maxSlots" in chart.render_error(scenario("keda-static"), sets=["workers[0].preWarm.maxSlots=0"])
    assert "lead" in chart.render_error(scenario("keda-static"), sets=["workers[0].preWarm.lead=soon"])
    assert "readInterval" in chart.render_error(scenario("keda-static"), sets=["sentinel.schedule.readInterval=1"])
