"""podman in a temp storage, the static binaries and the images built from them: what the
docker stage's modules share (conftest.py makes fixtures of them).

The podman flags are what an unprivileged sandbox allows: the ``vfs`` storage driver, ``runc``
(crun refuses hosts with cgroups in hybrid mode), ``cgroupfs`` and a file events backend; and a
containers.conf whose default ulimits are ours, since podman's defaults are above them and
setting them is refused (``podman pod create`` has no ``--ulimit`` for the pod's infra
container).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SENTINEL_IMAGE = "localhost/astro-sentinel:test"
AGENT_IMAGE = "localhost/astro-agent:test"
TASKS_IMAGE = "localhost/airflow-tasks:test"


def ensure_podman() -> str:
    """podman and runc, installed with apt when missing (as root)."""
    missing = [p for p in ("podman", "runc") if not shutil.which(p)]
    if missing:
        if os.geteuid() != 0:
            pytest.fail(f"missing {missing} and this is not root: apt-get install -y {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    path = shutil.which("podman")
    assert path and shutil.which("runc"), "podman or runc still missing after apt-get install"
    return path


class Podman:
    """``podman(*args)`` runs one podman command in the session's storage."""

    def __init__(self, binary: str, store: Path):
        self.store = store
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        conf = store / "containers.conf"
        conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={soft}:{hard}", "nproc=4096:4096"]\n')
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.base = [binary, "--root", str(store / "root"), "--runroot", str(store / "run"),
                     "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
                     "--runtime", shutil.which("runc")]

    def __call__(self, *args, check=True, timeout=600, **kw) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.base, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, timeout=timeout, env=self.env, **kw)
        if check and result.returncode != 0:
            pytest.fail(f"podman {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def exported_files(self, image: str, into: Path) -> list[str]:
        """The regular files of ``image``'s root file system (what ``podman export`` writes),
        minus the ones the runtime adds to every container."""
        import tarfile

        cid = self("create", image).stdout.strip()
        try:
            self("export", "-o", str(into), cid)
        finally:
            self("rm", cid, check=False)
        with tarfile.open(into) as tar:
            files = sorted(m.name.lstrip("./") for m in tar.getmembers() if not m.isdir())
        into.unlink()
        return [f for f in files if f not in ("etc/hosts", "etc/resolv.conf", "etc/hostname", "run/.containerenv")]


# ---- the static binaries ----------------------------------------------------------------------


def has_interpreter(path: Path) -> bool:
    """True when the ELF file has a PT_INTERP program header (it needs a dynamic loader)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path} is not a 64-bit ELF file"
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return any(struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 3 for i in range(phnum))


def static_binary(name: str) -> Path:
    """``$ASTRO_<NAME>_BIN`` from the test command's one release build (tests/lib/cargo-target.sh),
    else built here with the same flags."""
    given = os.environ.get(f"{name.upper().replace('-', '_')}_BIN")
    if given:
        return Path(given)
    built = subprocess.run(["bash", "-c", ". tests/lib/cache.sh && . tests/lib/cargo-target.sh && "
                            "cargo_release_build --locked >&2 && "
                            f'echo "$ASTRO_RELEASE_DIR/{name}"'],
                           cwd=REPO, check=True, stdout=subprocess.PIPE, text=True, timeout=3600)
    return Path(built.stdout.strip())


# ---- the images -------------------------------------------------------------------------------


def build_from_binary(podman: Podman, dockerfile: Path, binary: Path, tag: str, context: Path) -> dict:
    """``podman build --build-arg BINARY_FROM=context`` of a Dockerfile whose final stage is
    FROM scratch: nothing is pulled. Returns ``podman image inspect``."""
    shutil.copy2(binary, context / binary.name)
    podman("build", "--build-arg", "BINARY_FROM=context", "-f", str(dockerfile), "-t", tag, str(context),
           timeout=900)
    return json.loads(podman("image", "inspect", tag).stdout)[0]
