"""The ValidatingAdmissionPolicy that holds the Sentinel's `patch` on pods to the deletion-cost
annotation of this release's workers: rendered with idle-first scale-in, bound to the release
namespace, matching the Sentinel's ServiceAccount only; off with idle-first scale-in or alone.
(That the real API server enforces it: tests/cluster/test_scale_in_idle_first.py.)"""

from conftest import NAMESPACE, scenario


def _objects(r):
    return r.all("ValidatingAdmissionPolicy"), r.all("ValidatingAdmissionPolicyBinding")


def test_the_policy_binds_the_sentinel_to_one_annotation(chart, validate):
    r = chart.render(scenario("keda-static"))
    (policy,), (binding,) = _objects(r)
    validate(policy)
    validate(binding)
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == binding["spec"]["policyName"] \
        == f"astro-{NAMESPACE}-sentinel-pod-patch"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["UPDATE"]}]
    (who,) = spec["matchConditions"]
    assert r.get("ServiceAccount", "astro-sentinel")["metadata"]["namespace"] == NAMESPACE
    assert who["expression"] == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:astro-sentinel'"
    text = " ".join(v["expression"] for v in spec["validations"])
    assert "controller.kubernetes.io/pod-deletion-cost" in text and "object.spec == oldObject.spec" in text
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": NAMESPACE}


def test_no_policy_without_the_patching_or_when_turned_off(chart):
    assert _objects(chart.render(scenario("defaults"))) == ([], [])  # no Sentinel
    for sets in (["sentinel.kubernetes.idleFirstScaleIn=false"], ["sentinel.kubernetes.podPatchPolicy.enabled=false"],
                 ["sentinel.kubernetes.enabled=false"]):
        r = chart.render(scenario("keda-static"), sets=sets)
        assert _objects(r) == ([], []), sets
