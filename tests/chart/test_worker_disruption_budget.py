"""The workers' PodDisruptionBudgets: one per worker, on exactly its Pods, by maxUnavailable (a pool
at 0 or 1 worker never blocks a drain); off per worker or for all; a bad value named."""

import pytest

from conftest import VALID_SCENARIOS, effective, scenario


def _budgets(r):
    return {b["metadata"]["name"]: b for b in r.all("PodDisruptionBudget")}


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_each_worker_has_a_budget_on_its_own_pods(chart, name, validate):
    _, workers = effective(name)
    r = chart.render(scenario(name))
    budgets = _budgets(r)
    for w in workers:
        if not w["podDisruptionBudget"]["enabled"]:
            assert w["deployment"] not in budgets
            continue
        b = budgets[w["deployment"]]
        validate(b)
        assert b["apiVersion"] == "policy/v1"
        assert b["spec"]["selector"] == r.get("Deployment", w["deployment"])["spec"]["selector"]
        assert b["spec"]["maxUnavailable"] == w["podDisruptionBudget"]["maxUnavailable"]
        assert "minAvailable" not in b["spec"]
    assert set(budgets) <= {w["deployment"] for w in workers}


def test_defaults_allow_one_pod_down_at_a_time(chart):
    r = chart.render(scenario("defaults"))
    assert _budgets(r)["astro-worker-default"]["spec"]["maxUnavailable"] == 1


def test_a_percentage_and_the_opt_out(chart):
    r = chart.render(scenario("defaults"), sets=["workerDefaults.podDisruptionBudget.maxUnavailable=25%"])
    assert _budgets(r)["astro-worker-default"]["spec"]["maxUnavailable"] == "25%"
    r = chart.render(scenario("defaults"), sets=["workerDefaults.podDisruptionBudget.enabled=false"])
    assert _budgets(r) == {}


@pytest.mark.parametrize("value", ["0", "150%", "half"])
def test_a_bad_budget_is_refused_naming_the_field(chart, value):
    error = chart.render_error(scenario("defaults"), sets=[f"workerDefaults.podDisruptionBudget.maxUnavailable={value}"])
    assert "maxUnavailable" in error, error
