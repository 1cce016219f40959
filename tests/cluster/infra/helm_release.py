"""The cluster tests' helm: ``helm template`` of charts/astro-agent (:func:`render_chart`) and one
release of it in the test cluster (:class:`HelmRelease`), with the pinned helm binary."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterable

TESTS = Path(__file__).resolve().parents[2]
CHART = TESTS.parent / "charts" / "astro-agent"


def helm_binary() -> str:
    """The pinned helm: $ASTRO_HELM, else built (once) by tests/chart/helm.sh."""
    if os.environ.get("ASTRO_HELM"):
        return os.environ["ASTRO_HELM"]
    out = subprocess.run(["bash", str(TESTS / "chart" / "helm.sh")], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def render_chart(release: str, namespace: str, values_files: Iterable[Path | str], sets: Iterable[str] = ()) -> list[dict]:
    """``helm template`` of the chart: the rendered objects."""
    import yaml

    argv = [helm_binary(), "template", release, str(CHART), "--namespace", namespace]
    for f in values_files:
        argv += ["-f", str(f)]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


class HelmRelease:
    """``helm install/upgrade/uninstall`` of the chart as ``name`` in ``namespace``.

    Values are Python dicts, written as JSON (a YAML subset) files next to the kubeconfig, so a
    test states exactly what a user's values file would say.
    """

    def __init__(self, kubeconfig: Path, name: str, namespace: str, workdir: Path, helm: Path | None = None):
        self.helm = Path(helm or helm_binary())
        self.kubeconfig = Path(kubeconfig)
        self.name = name
        self.namespace = namespace
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._revision = 0
        self.installed = False

    def install(self, *values: dict[str, Any]) -> str:
        """``helm install --create-namespace``; returns helm's output (NOTES included)."""
        self.installed = True  # also when helm fails half-way: what it created is uninstalled
        return self._run("install", self.name, str(CHART), "--create-namespace", *self._values_args(values))

    def upgrade(self, *values: dict[str, Any]) -> str:
        return self._run("upgrade", self.name, str(CHART), *self._values_args(values))

    def uninstall(self) -> str:
        output = self._run("uninstall", self.name, "--wait", "--timeout", "120s")
        self.installed = False
        return output

    def manifest(self) -> list[dict[str, Any]]:
        """The objects of the current revision, as helm stored them."""
        import yaml

        text = self._run("get", "manifest", self.name)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def _values_args(self, values: tuple[dict[str, Any], ...]) -> list[str]:
        self._revision += 1
        args = []
        for i, doc in enumerate(values):
            path = self.workdir / f"{self.name}-r{self._revision}-{i}.json"
            path.write_text(json.dumps(doc, indent=1))
            args += ["-f", str(path)]
        return args

    def _run(self, *args: str) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.workdir / "helm-cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm-config"),
            "HELM_DATA_HOME": str(self.workdir / "helm-data"),
        }
        result = subprocess.run(
            [str(self.helm), *args, "--namespace", self.namespace],
            env=env, capture_output=True, text=True, timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args[:2])} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
        return result.stdout
