"""values.schema.json keeps each shape used more than once (a worker, a {value, existingSecret}
setting, an image, a probe, durations, string maps) once, under `definitions`, and points at it with
`$ref`. These tests make sure every place that points at a shape still checks it, through the real
helm: a wrong value there is refused, and helm's error names the key."""

import json

import jsonschema
import pytest
import yaml

from conftest import CHART, scenario

SCHEMA = json.loads((CHART / "values.schema.json").read_text())

# A workers entry the defaults scenario would render; cases add one wrong key to it.
WORKER = {"name": "default", "queues": ["default"]}

# Wrong values for keys of the shared worker, with the end of helm's message for each.
WORKER_CASES = {
    "type": ({"syncSlots": "many"}, "/syncSlots': got string, want integer"),
    "image": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy': value must be one of"),
    "probe": ({"livenessProbe": {"periodSeconds": 0}}, "/livenessProbe/periodSeconds': minimum: got 0, want 1"),
    "string-map": ({"podLabels": {"team": 7}}, "/podLabels/team': got number, want string"),
    "nested": ({"keda": {"fallback": {"behavior": "sometimes"}}}, "/keda/fallback/behavior': value must be one of"),
    "queues": ({"queues": 7}, "/queues': 'oneOf' failed"),
    "unknown-key": ({"syncslots": 4}, "': additional properties 'syncslots' not allowed"),
    "tasks-image": ({"tasks": {"image": {"pullPolicy": "Sometimes"}}}, "/tasks/image/pullPolicy': value must be one of"),
    "tasks-unknown-key": ({"tasks": {"extraVolumes": []}}, "/tasks': additional properties 'extraVolumes' not allowed"),
    # Tasks inherit only names the agent's allowlist can hold.
    "tasks-env-name": ({"tasks": {"env": [{"name": "team.bucket", "value": "b"}]}},
                       "/tasks/env/0/name': 'team.bucket' does not match pattern"),
}

# Every {value, existingSecret} setting, as a path of keys.
SECRET_REFS = [
    ("airflow", "edgeApiUrl"),
    ("airflow", "executionApiUrl"),
    ("airflow", "jwtSecret"),
    ("airflow", "restApi", "token"),
    ("airflow", "restApi", "username"),
    ("airflow", "restApi", "password"),
    ("keda", "auth", "staticToken"),
    ("sentinel", "source", "postgres", "url"),
]


def nest(path, value):
    for key in reversed(path):
        value = {key: value}
    return value


def refused(chart, tmp_path, overlay):
    """helm's error for the defaults scenario with `overlay` on top (a second -f file, so a
    workers list given here replaces the scenario's, as it would for a user)."""
    f = tmp_path / "overlay.yaml"
    f.write_text(yaml.safe_dump(overlay))
    return chart.render_error(scenario("defaults"), f)


@pytest.mark.parametrize("case", WORKER_CASES)
def test_a_wrong_worker_key_is_refused_in_a_workers_entry(chart, tmp_path, case):
    bad, message = WORKER_CASES[case]
    err = refused(chart, tmp_path, {"workers": [{**WORKER, **bad}]})
    assert f"at '/workers/0{message}" in err, err
    # The entry has its name: the only complaint is the wrong key.
    assert "missing property" not in err, err


@pytest.mark.parametrize("case", WORKER_CASES)
def test_a_wrong_worker_key_is_refused_in_worker_defaults(chart, tmp_path, case):
    bad, message = WORKER_CASES[case]
    err = refused(chart, tmp_path, {"workerDefaults": bad})
    assert f"at '/workerDefaults{message}" in err, err


def test_a_wrong_key_in_a_later_workers_entry_names_that_entry(chart, tmp_path):
    err = refused(chart, tmp_path, {"workers": [WORKER, {"name": "b", "queues": "b", "replicas": -1}]})
    assert "at '/workers/1/replicas': minimum: got -1, want 0" in err, err
    assert "/workers/0" not in err, err


def test_a_workers_entry_needs_a_name(chart, tmp_path):
    err = refused(chart, tmp_path, {"workers": [{"queues": ["default"]}]})
    assert "at '/workers/0': missing property 'name'" in err, err


def test_worker_defaults_take_no_name(chart, tmp_path):
    # The shared worker has `name` for the workers entries; workerDefaults must still refuse it.
    err = refused(chart, tmp_path, {"workerDefaults": {"name": "everyone"}})
    assert "at '/workerDefaults/name'" in err, err


def test_a_workers_entry_takes_every_key_of_worker_defaults(chart, tmp_path):
    """The shared worker accepts, in a workers entry, everything values.yaml sets in
    workerDefaults, so the two cannot drift apart."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["workerDefaults"]
    f = tmp_path / "overlay.yaml"
    f.write_text(yaml.safe_dump({"workers": [{**defaults, **WORKER}]}))
    assert chart.render(scenario("defaults"), f).all("Deployment")


@pytest.mark.parametrize("path", SECRET_REFS, ids=".".join)
def test_every_secret_setting_checks_its_shape(chart, tmp_path, path):
    where = "/" + "/".join(path)
    err = refused(chart, tmp_path, nest(path, {"existingSecret": {"name": "s", "keys": "k"}}))
    assert f"at '{where}/existingSecret': additional properties 'keys' not allowed" in err, err
    err = refused(chart, tmp_path, nest(path, {"value": 7}))
    assert f"at '{where}/value': got number, want string" in err, err
    err = refused(chart, tmp_path, nest(path, {"secret": "s"}))
    assert f"at '{where}': additional properties 'secret' not allowed" in err, err


@pytest.mark.parametrize("overlay, message", [
    ({"sentinel": {"image": {"tag": ["1"]}}}, "at '/sentinel/image/tag': got array, want number or string"),
    ({"sentinel": {"readinessProbe": {"timeoutSeconds": 0}}}, "at '/sentinel/readinessProbe/timeoutSeconds': minimum"),
    ({"sentinel": {"stalenessLimit": "a while"}}, "at '/sentinel/stalenessLimit': 'a while' does not match pattern"),
    ({"keda": {"auth": {"boundServiceAccountToken": {"cacheTtl": "5 min"}}}},
     "at '/keda/auth/boundServiceAccountToken/cacheTtl': '5 min' does not match pattern"),
    ({"monitoring": {"prometheusRule": {"thresholds": {"poolStuckAtZeroFor": "10us"}}}},
     "at '/monitoring/prometheusRule/thresholds/poolStuckAtZeroFor': '10us' does not match pattern"),
    ({"commonLabels": {"team": True}}, "at '/commonLabels/team': got boolean, want string"),
], ids=["image", "probe", "duration", "duration-in-keda", "prometheus-duration", "string-map"])
def test_other_shared_shapes_are_checked_where_they_are_used(chart, tmp_path, overlay, message):
    err = refused(chart, tmp_path, overlay)
    assert message in err, err


def _refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"]
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_schema_is_draft_07_and_every_definition_is_used():
    # Draft-07 on purpose: helm's validator and older ones read it alike. In draft-07 keywords
    # beside a $ref are ignored, so a rule added there would silently check nothing.
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    refs = list(_refs(SCHEMA))
    assert all(r.startswith("#/definitions/") and r[len("#/definitions/"):] in SCHEMA["definitions"] for r in refs), refs
    assert {r[len("#/definitions/"):] for r in refs} == set(SCHEMA["definitions"]), "a definition nothing uses"

    def beside_ref(node):
        if isinstance(node, dict):
            if "$ref" in node:
                yield from (k for k in node if k not in ("$ref", "description", "$comment"))
            for v in node.values():
                yield from beside_ref(v)
        elif isinstance(node, list):
            for v in node:
                yield from beside_ref(v)

    assert not list(beside_ref(SCHEMA)), "a validation keyword beside a $ref, which draft-07 ignores"


def test_schema_rejects_wrong_types(chart):
    base = scenario("defaults")
    err = chart.render_error(base, sets=["workers[0].syncSlots=many"])
    assert "/workers/0/syncSlots" in err
    err = chart.render_error(base, sets=["workerDefaults.keda.fallback.behavior=sometimes"])
    assert "/workerDefaults/keda/fallback/behavior" in err
    err = chart.render_error(base, sets=["sentinel.refreshInterval=soon"])
    assert "/sentinel/refreshInterval" in err
