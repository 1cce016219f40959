"""Fixtures of the docker stage (podman_harness.py has the code behind them).

podman is installed with apt when missing (root). Images, containers, pods and volumes live in
a temp podman storage (``--root``) that is removed at the end of the session.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import tasks_image as assembly
from podman_harness import (AGENT_IMAGE, REPO, SENTINEL_IMAGE, TASKS_IMAGE, Podman, build_from_binary,
                            ensure_podman, static_binary)


@pytest.fixture(scope="session")
def podman(tmp_path_factory):
    binary = ensure_podman()
    store = tmp_path_factory.mktemp("podman")
    run = Podman(binary, store)
    yield run
    run("pod", "rm", "--all", "--force", check=False)
    run("rm", "--all", "--force", check=False)
    run("volume", "rm", "--all", "--force", check=False)
    run("rmi", "--all", "--force", check=False)
    subprocess.run(["chmod", "-R", "u+rwX", str(store)], check=False)
    shutil.rmtree(store, ignore_errors=True)


@pytest.fixture(scope="session")
def static_sentinel() -> Path:
    return static_binary("astro-sentinel")


@pytest.fixture(scope="session")
def static_agent() -> Path:
    return static_binary("astro-agent")


@pytest.fixture(scope="session")
def sentinel_image(podman, static_sentinel, tmp_path_factory) -> dict:
    return build_from_binary(podman, REPO / "docker/sentinel/Dockerfile", static_sentinel, SENTINEL_IMAGE,
                             tmp_path_factory.mktemp("sentinel-context"))


@pytest.fixture(scope="session")
def agent_image(podman, static_agent, tmp_path_factory) -> dict:
    return build_from_binary(podman, REPO / "docker/agent/Dockerfile", static_agent, AGENT_IMAGE,
                             tmp_path_factory.mktemp("agent-context"))


@pytest.fixture(scope="session")
def tasks_image(podman) -> dict:
    """The stand-in for a user's Airflow image (tasks_image.py): assembled once, cached, imported."""
    tarball, assembled = assembly.tarball()
    started = time.monotonic()
    changes = [arg for line in assembly.CONFIG for arg in ("--change", line)]
    podman("import", "-q", *changes, str(tarball), TASKS_IMAGE, timeout=900)
    imported = time.monotonic() - started
    print(f"\ntasks image: {tarball.stat().st_size / 1e6:.0f} MB, "
          + (f"assembled in {assembled:.1f}s, " if assembled is not None else "from the cache, ")
          + f"imported in {imported:.1f}s")
    return json.loads(podman("image", "inspect", TASKS_IMAGE).stdout)[0]
