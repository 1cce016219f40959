"""What a user reads: NOTES after an install, a `## @param` comment per value in values.yaml, and
every value in the chart's README."""

import re

from conftest import CHART, NAMESPACE, chart_defaults, scenario


def test_notes_tell_how_to_check_the_scaling_objects(chart):
    notes = chart.notes(scenario("keda-bound"))
    assert f"kubectl get scaledobject -n {NAMESPACE}" in notes
    assert "kubectl describe scaledobject" in notes and "astro-worker-etl" in notes
    assert "kubectl create token" in notes and "--as=system:serviceaccount:keda-system:keda-operator-sa" in notes
    # Each worker's tasks image, and where its tasks' output goes.
    notes = chart.notes(scenario("mixed"))
    assert "prod-worker-pinned  queues=pinned" in notes and "tasks=registry.local/data/airflow:3.3.2-dags" in notes
    assert f"kubectl logs -n {NAMESPACE} deployment/prod-worker-default -c tasks" in notes
    notes = chart.notes(scenario("hpa"))
    assert f"kubectl get hpa -n {NAMESPACE}" in notes
    assert f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/deployments.apps/astro-worker-default-worker/astro_agent_client_queued_or_running_tasks" in notes
    notes = chart.notes(scenario("keda-static"))
    assert "astro-keda-sentinel-token" in notes and "/v1/workers" in notes
    assert "WARNING" not in notes
    notes = chart.notes(scenario("keda-static"), sets=["serviceMonitor.sentinel.enabled=true"])
    assert "WARNING: serviceMonitor.sentinel is on but sentinel.networkPolicy.metricsFrom is empty" in notes
    # An HPA worker scales on what Prometheus scrapes: a policy that admits no scraper is said.
    notes = chart.notes(scenario("hpa"))
    assert "WARNING: astro-worker-default-worker is scraped by Prometheus (its HPA scales on what Prometheus reads)" in notes
    notes = chart.notes(scenario("hpa"), sets=["workerDefaults.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring"])
    assert "is scraped by Prometheus" not in notes


def _leaf_paths(node, prefix=""):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaf_paths(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix


def _documented_keys():
    """The keys of values.yaml's `## @param` lines; a map documented as one key covers its children."""
    text = (CHART / "values.yaml").read_text()
    return set(re.findall(r"^\s*## @param (\S+)", text, re.M))


def _covered(leaf, params):
    return any(leaf == p or leaf.startswith(p + ".") for p in params)


def _path_exists(values, path):
    node = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_values_yaml_has_a_param_comment_per_value():
    params = _documented_keys()
    defaults = chart_defaults()
    uncovered = [leaf for leaf in _leaf_paths(defaults) if not _covered(leaf, params)]
    assert not uncovered, f"values without a ## @param line: {uncovered}"
    stray = [p for p in params if not _path_exists(defaults, p)]
    assert not stray, f"## @param lines naming no value: {stray}"


def test_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    missing = [p for p in sorted(_documented_keys()) if f"`{p}`" not in readme]
    assert not missing, f"values not documented in charts/astro-agent/README.md: {missing}"
