"""The HPA path: each HPA worker's HorizontalPodAutoscaler on the prometheus-adapter metric, its
scaling behavior by default and overridden, pre-warm's second metric where asked, and the adapter
rules the chart ships and renders."""

import math
import re

import pytest
import yaml

from conftest import CHART, NAMESPACE, VALID_SCENARIOS, container, deep_merge, effective, env_of, scenario

# The rule of the core spec, character for character.
SEED_METRICS_QUERY = (
    'sum by (job) (max by (job, queue, state) '
    '(<<.Series>>{state=~"queued|running", <<.LabelMatchers>>}))'
)
SEED_SERIES_QUERY = '{__name__="astro_agent_client_queue_stats",container!="POD",namespace!="",pod!=""}'
# The Sentinel's pre-warm series, per worker Deployment (its `worker` label is the Deployment's name).
PRE_WARM_RULE = {
    "seriesQuery": '{__name__="astro_sentinel_worker_expected_slots",namespace!="",worker!=""}',
    "resources": {"overrides": {"worker": {"group": "apps", "resource": "deployment"},
                                "namespace": {"resource": "namespace"}}},
    "name": {"matches": "^astro_sentinel_worker_expected_slots$", "as": "astro_sentinel_worker_expected_slots"},
    "metricsQuery": "max by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})",
}
# Fast up, slow down: the HPA path's default behavior.
SEED_HPA_BEHAVIOR = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}, {"type": "Pods", "value": 4, "periodSeconds": 15}],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 300,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
    },
}


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_hpa_scales_on_the_adapter_metric_with_average_value(chart, name):
    _, workers = effective(name)
    r = chart.render(scenario(name))
    hpa_workers = [w for w in workers if w["mode"] == "hpa"]
    assert sorted(h["metadata"]["name"] for h in r.all("HorizontalPodAutoscaler")) == sorted(w["deployment"] for w in hpa_workers)
    for w in hpa_workers:
        h = r.get("HorizontalPodAutoscaler", w["deployment"])
        assert h["apiVersion"] == "autoscaling/v2"
        spec = h["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": w["deployment"]}
        assert spec["minReplicas"] == w["hpa"]["minReplicaCount"] >= 1
        assert spec["maxReplicas"] == w["hpa"]["maxReplicaCount"]
        metric = spec["metrics"][0]
        assert metric["type"] == "Object"
        assert metric["object"]["describedObject"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": w["deployment"]}
        assert metric["object"]["metric"] == {"name": "astro_agent_client_queued_or_running_tasks"}
        target = w["hpa"]["metric"]["target"]["averageValue"] or w["syncSlots"]
        assert metric["object"]["target"] == {"type": "AverageValue", "averageValue": str(target)}
        assert spec["metrics"][1:] == w["hpa"]["extraMetrics"]  # no pre-warm metric unless asked
        assert spec["behavior"] == deep_merge(SEED_HPA_BEHAVIOR, w["hpa"]["behavior"])
        # The agent must export the queue stats the metric is built from.
        env = env_of(container(r.get("Deployment", w["deployment"]), "agent"))
        assert env["ASTRO_AGENT_REST_API_URL"]["value"]


def test_hpa_target_defaults_to_sync_slots(chart):
    r = chart.render(scenario("mixed"))
    h = r.get("HorizontalPodAutoscaler", "prod-worker-api-calls")
    assert h["spec"]["metrics"][0]["object"]["target"]["averageValue"] == "10"
    assert h["spec"]["behavior"] == SEED_HPA_BEHAVIOR


def seconds_to_scale_up(scale_up: dict, start: int, target: int, sync_period: int = 15) -> int:
    """When an HPA whose recommendation jumps from `start` to `target` replicas reaches it, with
    the HPA controller's scale-up limit (pkg/controller/podautoscaler, calculateScaleUpLimitWithScalingRules):
    each policy allows, from the replicas at the start of its period (the current count minus what
    was added within the last periodSeconds), +value Pods or ceil(replicas x (1 + value/100)); the
    selectPolicy picks the largest (Max) or smallest (Min). A recommendation is acted on at each
    sync; a stabilization window on scale-up only delays it further, so it must be 0 here."""
    assert scale_up.get("stabilizationWindowSeconds", 0) == 0
    pick = min if scale_up.get("selectPolicy", "Max") == "Min" else max
    replicas, added, now = start, [], 0  # added: (time, pods)
    while replicas < target:
        assert now <= 3600, "no scale-up within an hour"
        limits = []
        for p in scale_up["policies"]:
            in_period = sum(n for t, n in added if t > now - p["periodSeconds"])
            period_start = replicas - in_period
            if p["type"] == "Pods":
                limits.append(period_start + p["value"])
            else:
                limits.append(math.ceil(period_start * (1 + p["value"] / 100)))
        new = min(target, max(replicas, pick(limits)))
        if new > replicas:
            added.append((now, new - replicas))
            replicas = new
            if replicas == target:
                return now
        now += sync_period
    return now


def test_hpa_default_behavior_scales_up_fast_and_down_slowly(chart):
    """1 -> 10 within a minute (the previous default, one Pod per 60 s, took 8 minutes), and
    scale-in only after 300 s without a higher recommendation, then 2 Pods a minute."""
    r = chart.render(scenario("hpa"))
    (h, *_) = r.all("HorizontalPodAutoscaler")
    behavior = h["spec"]["behavior"]
    assert behavior == SEED_HPA_BEHAVIOR
    assert seconds_to_scale_up(behavior["scaleUp"], 1, 10) < 60
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    # The check itself tells a slow policy from a fast one.
    one_a_minute = {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}
    assert seconds_to_scale_up(one_a_minute, 1, 10) == 8 * 60  # nine one-Pod steps, a minute apart


def test_hpa_behavior_override_replaces_the_default_policies(chart):
    slow = [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    r = chart.render(scenario("hpa"), sets=[
        "workerDefaults.hpa.behavior.scaleUp.policies[0].type=Pods",
        "workerDefaults.hpa.behavior.scaleUp.policies[0].value=1",
        "workerDefaults.hpa.behavior.scaleUp.policies[0].periodSeconds=60",
        "workerDefaults.hpa.behavior.scaleDown.stabilizationWindowSeconds=30",
    ])
    for h in r.all("HorizontalPodAutoscaler"):
        behavior = h["spec"]["behavior"]
        assert behavior["scaleUp"]["policies"] == slow  # the list is replaced, not appended to
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 30
        # What the user did not set keeps its default.
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
        assert behavior["scaleDown"]["policies"] == SEED_HPA_BEHAVIOR["scaleDown"]["policies"]


def _check_seed_rule(rules):
    rule, pre_warm = rules
    assert pre_warm == PRE_WARM_RULE
    assert rule["metricsQuery"] == SEED_METRICS_QUERY
    assert rule["seriesQuery"] == SEED_SERIES_QUERY
    assert rule["name"] == {"matches": ".*astro_agent_client_queue_stats.*", "as": "astro_agent_client_queued_or_running_tasks"}
    assert rule["resources"]["overrides"]["job"]["resource"] == "deployment"
    assert rule["resources"]["overrides"]["namespace"]["resource"] == "namespace"


def test_shipped_adapter_values_carry_the_seed_rule():
    shipped = yaml.safe_load((CHART / "prometheus-adapter-values.yaml").read_text())
    _check_seed_rule(shipped["rules"]["custom"])


@pytest.mark.parametrize("name", ["hpa", "mixed"])
def test_rendered_adapter_config_carries_the_seed_rule(chart, name):
    values, _ = effective(name)
    r = chart.render(scenario(name))
    cm = r.get("ConfigMap", f"{values['resourceNamePrefix']}-prometheus-adapter-rules")
    assert cm["metadata"]["namespace"] == (values["prometheusAdapter"]["rules"]["namespace"] or NAMESPACE)
    _check_seed_rule(yaml.safe_load(cm["data"]["config.yaml"])["rules"])


def test_adapter_query_aggregates_like_the_seed():
    """What the query computes over per-pod series: duplicates of a queue-wide count collapse
    (max), queued + running add up per Deployment (sum); a rule that summed pods would not."""
    series = [  # (job, pod, queue, state, value): every pod reports the same queue-wide counts
        ("astro-worker-a", p, q, s, v)
        for p in ("pod-1", "pod-2", "pod-3")
        for q, s, v in (("default", "queued", 7), ("default", "running", 20), ("default", "success", 99),
                        ("etl", "queued", 3), ("etl", "running", 0))
    ]
    dedup = {}
    for job, _, q, s, v in series:
        if re.fullmatch("queued|running", s):
            dedup[(job, q, s)] = max(dedup.get((job, q, s), v), v)
    depth = sum(dedup.values())
    assert depth == 30
    assert math.ceil(depth / 20) == 2  # with averageValue = syncSlots = 20: two Pods


def test_pre_warm_on_the_hpa_path_is_a_second_object_metric_and_the_sentinel_reads_the_schedule(chart):
    sets = ("sentinel.enabled=true", "workers[0].hpa.preWarmMetric.enabled=true", "workers[0].preWarm.lead=45s")
    r = chart.render(scenario("hpa"), sets=sets)
    (h,) = r.all("HorizontalPodAutoscaler")
    queue_depth, pre_warm = h["spec"]["metrics"][:2]  # then the worker's extraMetrics
    assert queue_depth["object"]["metric"] == {"name": "astro_agent_client_queued_or_running_tasks"}
    assert pre_warm == {"type": "Object", "object": {
        "describedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "astro-worker-default-worker"},
        "metric": {"name": "astro_sentinel_worker_expected_slots"},
        # desired = ceil(expected slots / syncSlots), like the queue depth's
        "target": {"type": "AverageValue", "averageValue": "20"}}}
    config = yaml.safe_load(r.get("ConfigMap", "astro-sentinel")["data"]["config.yaml"])
    (worker,) = config["workers"]
    assert worker["scaledBy"] == "hpa" and worker["preWarm"] == {"enabled": True, "lead": "45s"}

    # Off by default, and off when the worker's preWarm is.
    for off in ((), ("workers[0].hpa.preWarmMetric.enabled=true", "workers[0].preWarm.enabled=false")):
        r = chart.render(scenario("hpa"), sets=("sentinel.enabled=true", *off))
        (h,) = r.all("HorizontalPodAutoscaler")
        assert "astro_sentinel_worker_expected_slots" not in str(h["spec"]["metrics"])
        (worker,) = yaml.safe_load(r.get("ConfigMap", "astro-sentinel")["data"]["config.yaml"])["workers"]
        assert "preWarm" not in worker


def test_pre_warm_on_the_hpa_path_needs_the_sentinel(chart):
    err = chart.render_error(scenario("hpa"), sets=("workers[0].hpa.preWarmMetric.enabled=true",))
    assert "workers[0].hpa.preWarmMetric.enabled" in err and "sentinel.enabled" in err
