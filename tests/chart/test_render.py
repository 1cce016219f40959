"""Every scenario through the real helm: `helm lint --strict`, each rendered object checked against its
API schema (Kubernetes' own or a pinned CRD's), the same output at every render, and values the chart
must refuse, each refusal naming the key."""

import pytest
import yaml

from conftest import INVALID_SCENARIOS, KUBE_VERSION, NAMESPACE, VALID_SCENARIOS, VALUES, scenario


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_helm_lint_strict(chart, name):
    proc = chart.run("lint", "--strict", ".", "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                     "-f", str(scenario(name)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(("name", "sets"), [(n, ()) for n in VALID_SCENARIOS]
                         + [("keda-static", ("workers[0].keda.trigger=external-push",))],
                         ids=VALID_SCENARIOS + ["keda-static-external-push"])
def test_two_renders_are_byte_identical(chart, name, sets):
    """What Argo CD and Flux rely on (they render with `helm template` and sync any difference).
    conftest renders every other test's values again at the end of the session too."""
    outputs = [chart.run(*chart.template_args([scenario(name)], sets)) for _ in range(2)]
    for proc in outputs:
        assert proc.returncode == 0, proc.stderr
    assert outputs[0].stdout == outputs[1].stdout


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_every_object_matches_its_api_schema(chart, validate, name):
    r = chart.render(scenario(name))
    assert r.docs, "nothing rendered"
    seen = set()
    for doc in r.docs:
        validate(doc)
        key = (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
        assert key not in seen, f"{key} rendered twice"
        seen.add(key)


def test_validator_catches_a_misspelt_scaledobject_field(chart, validate):
    """The CRD check is not a rubber stamp: a typo under spec fails it."""
    so = chart.render(scenario("keda-static")).all("ScaledObject")[0]
    broken = yaml.safe_load(yaml.safe_dump(so))
    broken["spec"]["minReplicas"] = broken["spec"].pop("minReplicaCount")
    with pytest.raises(pytest.fail.Exception):
        validate(broken)
    broken = yaml.safe_load(yaml.safe_dump(so))
    # (a pool at zero renders no fallback: KEDA's would wake it; the CRD's enum still applies)
    broken["spec"]["fallback"] = {"failureThreshold": 3, "replicas": 1, "behavior": "keepEverything"}
    with pytest.raises(pytest.fail.Exception):
        validate(broken)


@pytest.mark.parametrize("name", INVALID_SCENARIOS)
def test_invalid_values_are_refused_with_a_message_naming_the_key(chart, name):
    path = VALUES / "invalid" / f"{name}.yaml"
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <message>'"
    expected = first[len("# expect: "):]
    err = chart.render_error(path)
    assert expected in err, f"expected {expected!r} in:\n{err}"


def test_bare_chart_asks_for_the_airflow_connection(chart):
    err = chart.render_error()
    assert "airflow.edgeApiUrl is required when workers are defined" in err


def test_invalid_values_via_set_flags(chart):
    base = scenario("keda-static")
    err = chart.render_error(base, sets=["sentinel.enabled=false"])
    assert "sentinel.enabled is false" in err
    err = chart.render_error(base, sets=["workers[0].syncSlots=0"])
    assert "workers[0].syncSlots is 0" in err
    err = chart.render_error(base, sets=["workers[0].hpa.enabled=true"])
    assert "workers[0].keda.enabled and workers[0].hpa.enabled are both true" in err
