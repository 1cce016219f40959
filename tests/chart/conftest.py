"""Fixtures for the chart tests: a pinned helm, the chart's renderer, and validators built from
the Kubernetes API schemas (kubernetes-validate) and the real CRDs of KEDA and prometheus-operator
(read from their Go modules); and what a values file means, which the test files compare the
rendered objects with. Everything is offline once the caches are warm."""

import concurrent.futures
import copy
import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import jsonschema
import kubernetes_validate
import pytest
import yaml

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHART = ROOT / "charts" / "astro-agent"
VALUES = HERE / "values"
NAMESPACE = "astro-test"
RELEASE = "rel"


def read_pins():
    pins = {}
    for line in (HERE / "pins.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key] = value
    return pins


PINS = read_pins()
KUBE_VERSION = PINS["KUBE_VERSION"]

VALID_SCENARIOS = sorted(p.stem for p in VALUES.glob("*.yaml"))
INVALID_SCENARIOS = sorted(p.stem for p in (VALUES / "invalid").glob("*.yaml"))


def _tool(*args):
    out = subprocess.run(
        ["bash", str(HERE / "helm.sh"), *args], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    assert out, f"helm.sh {' '.join(args)} printed nothing"
    return out


@pytest.fixture(scope="session")
def helm():
    path = os.environ.get("ASTRO_HELM") or _tool()
    return path


class Rendered:
    """The objects of one `helm template` run, with lookups by kind and name."""

    def __init__(self, docs):
        self.docs = docs

    def all(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind, name, namespace=None):
        found = [
            d
            for d in self.docs
            if d["kind"] == kind
            and d["metadata"]["name"] == name
            and (namespace is None or d["metadata"].get("namespace") == namespace)
        ]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def maybe(self, kind, name):
        found = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        return found[0] if found else None


class Helm:
    def __init__(self, binary):
        self.binary = binary
        self._cache = {}
        self.outputs = {}  # key -> helm's output, rendered again at the session's end

    def run(self, *args, chart=CHART):
        return subprocess.run(
            [self.binary, *args], cwd=chart, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "KUBECONFIG": os.devnull},
        )

    def template_args(self, values_files, sets=(), kube_version=KUBE_VERSION):
        """`helm template` for the given Kubernetes version; None: the version helm assumes."""
        args = ["template", RELEASE, ".", "--namespace", NAMESPACE]
        if kube_version is not None:
            args += ["--kube-version", kube_version]
        for f in values_files:
            args += ["-f", str(f)]
        for s in sets:
            args += ["--set", s]
        return args

    def render(self, *values_files, sets=(), kube_version=KUBE_VERSION):
        key = (tuple(map(str, values_files)), tuple(sets), kube_version)
        if key not in self._cache:
            proc = self.run(*self.template_args(values_files, sets, kube_version))
            assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
            self.outputs[key] = proc.stdout
            docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
            self._cache[key] = Rendered(docs)
        return self._cache[key]

    def render_error(self, *values_files, sets=(), kube_version=KUBE_VERSION):
        proc = self.run(*self.template_args(values_files, sets, kube_version))
        assert proc.returncode != 0, "helm template succeeded but should have refused the values"
        return proc.stderr

    def notes(self, *values_files, sets=()):
        """NOTES.txt rendered offline: `helm template` skips it and `helm install --dry-run` wants
        a cluster, so a copy of the chart renders it through `tpl` inside a ConfigMap."""
        with tempfile.TemporaryDirectory() as tmp:
            chart = pathlib.Path(tmp) / "astro-agent"
            shutil.copytree(CHART, chart)
            (chart / "templates" / "NOTES.txt").rename(chart / "notes-under-test.txt")
            (chart / "templates" / "zz-notes.yaml").write_text(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
                '  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | quote }}\n'
            )
            args = self.template_args(values_files, sets) + ["--show-only", "templates/zz-notes.yaml"]
            proc = self.run(*args, chart=chart)
            assert proc.returncode == 0, proc.stderr
            return yaml.safe_load(proc.stdout)["data"]["notes"]


@pytest.fixture(scope="session")
def chart(helm):
    helm_ = Helm(helm)
    yield helm_
    # Render stability (GitOps renders with `helm template` and syncs on any difference): every
    # values set a test rendered comes out byte-identical when rendered again.
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        again = dict(zip(helm_.outputs, pool.map(
            lambda key: helm_.run(*helm_.template_args(list(key[0]), key[1], key[2])).stdout, helm_.outputs)))
    changed = [key for key, out in again.items() if out != helm_.outputs[key]]
    assert not changed, f"{len(changed)} of {len(again)} renders differ when repeated, e.g. {changed[0]}"


def scenario(name):
    return VALUES / f"{name}.yaml"


def load_values(name):
    return yaml.safe_load(scenario(name).read_text())


# ---------------------------------------------------------------------------------------------
# Schemas of custom resources, from the CRD YAML that the projects' Go modules carry.

CRD_FILES = {
    "KEDA": [
        "config/crd/bases/keda.sh_scaledobjects.yaml",
        "config/crd/bases/keda.sh_triggerauthentications.yaml",
        "config/crd/bases/keda.sh_clustertriggerauthentications.yaml",
    ],
    "PROMETHEUS_OPERATOR": ["example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"],
}


def _closed(schema):
    """The API server prunes fields a structural schema does not declare, so a typo would vanish
    silently; treat undeclared fields as errors instead, as `kubectl apply --validate=strict` does."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


_OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


@pytest.fixture(scope="session")
def crd_schemas():
    schemas = {}
    for project, files in CRD_FILES.items():
        module = PINS[f"{project}_MODULE"]
        version = PINS[f"{project}_VERSION"]
        moddir = pathlib.Path(os.environ.get(f"ASTRO_{project}_MODULE_DIR") or _tool("--mod", f"{module}@{version}"))
        for rel in files:
            crd = yaml.safe_load((moddir / rel).read_text())
            group = crd["spec"]["group"]
            kind = crd["spec"]["names"]["kind"]
            scope = crd["spec"]["scope"]
            for ver in crd["spec"]["versions"]:
                if not ver.get("served"):
                    continue
                schema = _closed(ver["schema"]["openAPIV3Schema"])
                schema.setdefault("properties", {})["metadata"] = _OBJECT_META
                schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata", "spec"})
                schemas[(f"{group}/{ver['name']}", kind)] = (scope, schema)
    assert ("keda.sh/v1alpha1", "ScaledObject") in schemas
    assert ("monitoring.coreos.com/v1", "ServiceMonitor") in schemas
    return schemas


@pytest.fixture(scope="session")
def validate(crd_schemas):
    """Validates one rendered object against its API schema; fails for a kind it has no schema for."""

    def check(doc):
        key = (doc["apiVersion"], doc["kind"])
        where = f"{doc['kind']}/{doc['metadata'].get('name')}"
        if key in crd_schemas:
            scope, schema = crd_schemas[key]
            errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
            if errors:
                pytest.fail(f"{where}: " + "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors[:5]))
            if scope == "Cluster":
                assert "namespace" not in doc["metadata"], f"{where} is cluster-scoped"
            return
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{where}: no schema for {key} (neither Kubernetes {KUBE_VERSION} nor a pinned CRD)")
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")

    return check


def dump(obj):
    return json.dumps(obj, indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# What a values file means, computed independently of the chart's templates.


def chart_defaults():
    return yaml.safe_load((CHART / "values.yaml").read_text())


def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        elif v is not None:
            out[k] = v
    return out


def effective(name):
    """Chart defaults + the scenario's values, and each worker merged over workerDefaults."""
    values = deep_merge(chart_defaults(), load_values(name))
    prefix = values["resourceNamePrefix"]
    workers = []
    for entry in values["workers"]:
        w = deep_merge(values["workerDefaults"], entry)
        q = w["queues"]
        w["queues"] = [s.strip() for s in (q.split(",") if isinstance(q, str) else q) if s.strip()]
        w["deployment"] = f"{prefix}-worker-{w['name']}"
        w["mode"] = "keda" if w["keda"]["enabled"] else "hpa" if w["hpa"]["enabled"] else "fixed"
        workers.append(w)
    return values, workers


def container(deploy, name):
    """A Pod's container by name, an app or an init container (the worker's `tasks` sidecar and
    `install-agent` are init containers)."""
    spec = deploy["spec"]["template"]["spec"]
    found = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    assert len(found) == 1
    return found[0]


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


ENSURE_SECRETS = "astro-sentinel-ensure-secrets"


def is_hook(doc):
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def ensure_secrets_args(r):
    """The arguments of the pre-install Job's `astro-sentinel ensure-secrets` ([] without the Job)."""
    job = r.maybe("Job", ENSURE_SECRETS)
    if not job:
        return []
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "ensure-secrets"
    return c["args"][1:]


def sentinel_config(r, values):
    cm = r.get("ConfigMap", f"{values['resourceNamePrefix']}-sentinel")
    return yaml.safe_load(cm["data"]["config.yaml"])
