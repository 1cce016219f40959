"""The workers' NetworkPolicies: one per worker, on its own Pods, letting the configured scrapers
and node addresses reach the agent's port and nothing else in; egress left alone; off per worker
or for all."""

import pytest

from conftest import VALID_SCENARIOS, container, effective, scenario


def _policies(r):
    return {p["metadata"]["name"]: p for p in r.all("NetworkPolicy")}


@pytest.mark.parametrize("name", VALID_SCENARIOS)
def test_each_worker_admits_only_scrapers_and_nodes_to_the_agents_port(chart, name, validate):
    _, workers = effective(name)
    r = chart.render(scenario(name))
    policies = _policies(r)
    for w in workers:
        if not w["networkPolicy"]["enabled"]:
            assert w["deployment"] not in policies
            continue
        p = policies[w["deployment"]]
        validate(p)
        d = r.get("Deployment", w["deployment"])
        # The policy selects exactly the worker's Pods: the Deployment's own selector.
        assert p["spec"]["podSelector"] == d["spec"]["selector"]
        # Ingress alone: the agent and tasks reach Airflow, the Sentinel and what tasks call.
        assert p["spec"]["policyTypes"] == ["Ingress"]
        assert "egress" not in p["spec"]
        expected_from = [{"ipBlock": {"cidr": c}} for c in w["networkPolicy"]["nodeCidrs"]] + w["networkPolicy"]["metricsFrom"]
        if not expected_from:
            assert p["spec"]["ingress"] == []
            continue
        (rule,) = p["spec"]["ingress"]
        assert rule["from"] == expected_from
        assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
        # "http" is the agent's admin port, and the Pod's only port.
        ports = [port for c in d["spec"]["template"]["spec"]["containers"] for port in c.get("ports", [])]
        assert [port["name"] for port in ports] == ["http"]
        assert container(d, "agent")["ports"][0]["containerPort"] == 39091


def test_defaults_let_in_nothing_but_the_node(chart):
    r = chart.render(scenario("defaults"))
    p = _policies(r)["astro-worker-default"]
    assert p["spec"]["ingress"] == []


def test_scrapers_and_node_addresses_are_listed(chart):
    r = chart.render(scenario("defaults"), sets=[
        "workerDefaults.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
        "workerDefaults.networkPolicy.nodeCidrs[0]=10.0.0.0/16",
    ])
    (rule,) = _policies(r)["astro-worker-default"]["spec"]["ingress"]
    assert rule["from"] == [
        {"ipBlock": {"cidr": "10.0.0.0/16"}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    ]


def test_opt_out_for_all_workers_or_one(chart):
    _, workers = effective("mixed")
    assert len(workers) > 1
    r = chart.render(scenario("mixed"), sets=["workerDefaults.networkPolicy.enabled=false"])
    assert not [n for n in _policies(r) if "-worker-" in n or n.startswith("prod-worker")]
    r = chart.render(scenario("mixed"), sets=["workers[0].networkPolicy.enabled=false"])
    names = set(_policies(r))
    assert workers[0]["deployment"] not in names
    assert {w["deployment"] for w in workers[1:]} <= names


def test_a_bad_cidr_is_refused_by_the_schema(chart):
    err = chart.render_error(scenario("defaults"), sets=["workerDefaults.networkPolicy.nodeCidrs[0]=the-node"])
    assert "nodeCidrs" in err
