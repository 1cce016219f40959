"""A real Prometheus server (and its promtool) for end-to-end tests.

The binaries are the ones of Debian's ``prometheus`` package:

* ``prometheus`` and ``promtool`` on PATH are used as they are;
* otherwise the package is fetched with ``apt-get download`` (after ``apt-get update``
  when apt knows no candidate and we are root) and unpacked with ``dpkg-deb -x`` into
  ``${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}/prometheus/<version>/``. Unpacking
  instead of ``apt-get install`` is deliberate: the package's maintainer script would
  start a system-wide Prometheus on 0.0.0.0:9090 wherever no policy-rc.d forbids it.

:class:`PrometheusServer` runs one server on 127.0.0.1 on a free port with a temporary
data directory, as a :class:`harness.procs.Daemon` (own process group, stopped by PID), and
wraps the parts of the HTTP API the tests use (standard library only, so the chart
tests can import :func:`promtool` too). Use it as a context manager, or call
:meth:`PrometheusServer.stop` in a ``finally``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterable

from harness.procs import Daemon, StartupError, apt_lock, free_port, wait_for


class PromQLError(RuntimeError):
    """The HTTP API answered with ``status: error`` (e.g. a query that does not parse)."""

    def __init__(self, error_type: str, error: str, expr: str | None = None):
        self.error_type = error_type
        self.error = error
        super().__init__(f"{error_type}: {error}" + (f" (query: {expr})" if expr else ""))


def cache_dir() -> Path:
    return Path(os.environ.get("ASTRO_CACHE_DIR") or Path.home() / ".cache" / "astro-agent")


def _candidate_version() -> str | None:
    out = subprocess.run(
        ["apt-cache", "policy", "prometheus"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ).stdout
    for line in out.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "Candidate":
            value = value.strip()
            return None if value in ("", "(none)") else value
    return None


def _unpacked_binaries(root: Path) -> tuple[Path, Path] | None:
    prometheus, promtool = root / "usr" / "bin" / "prometheus", root / "usr" / "bin" / "promtool"
    if prometheus.is_file() and promtool.is_file():
        return prometheus, promtool
    return None


def binaries() -> tuple[Path, Path]:
    """Paths of ``prometheus`` and ``promtool`` (see the module docstring for where from)."""
    on_path = shutil.which("prometheus"), shutil.which("promtool")
    if all(on_path):
        return Path(on_path[0]), Path(on_path[1])

    version = _candidate_version()
    if version is None:
        if os.geteuid() != 0:
            raise RuntimeError("prometheus/promtool not found and apt knows no candidate: "
                               "install Debian's prometheus package (or run as root once)")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        with apt_lock():
            if _candidate_version() is None:
                subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
        version = _candidate_version()
        if version is None:
            raise RuntimeError("apt-get update ran but apt still has no candidate for 'prometheus'")

    base = cache_dir() / "prometheus"
    target = base / version.replace(":", "_").replace("/", "_")
    found = _unpacked_binaries(target)
    if found:
        return found

    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="download.", dir=base))
    try:
        # apt-get download writes into the current directory; as root apt drops privileges
        # to _apt for the download, which must be able to write there.
        os.chmod(work, 0o777)
        subprocess.run(["apt-get", "download", f"prometheus={version}"], cwd=work, check=True,
                       stdout=subprocess.DEVNULL)
        (deb,) = list(work.glob("prometheus_*.deb"))
        unpacked = work / "root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
        if not _unpacked_binaries(unpacked):
            raise RuntimeError(f"{deb.name} has no usr/bin/prometheus and usr/bin/promtool")
        try:
            unpacked.rename(target)  # atomic: a half-unpacked tree is never used
        except OSError:
            if not _unpacked_binaries(target):  # a concurrent run did not win either
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found = _unpacked_binaries(target)
    assert found, target
    return found


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run ``promtool ARGS`` (stdout and stderr captured as text; no check of the exit code)."""
    return subprocess.run(
        [str(binaries()[1]), *args], input=stdin, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, timeout=timeout,
    )


class PrometheusServer:
    """One Prometheus on 127.0.0.1:<free port> with ``config`` (a dict, written as JSON,
    which Prometheus reads as YAML) and a temporary data directory.

    ``bin_dir``: a folder with ``prometheus`` and ``promtool`` to run instead of Debian's (e.g.
    a build with Kubernetes service discovery, which Debian's package leaves out).

    Attributes after :meth:`start`: ``url``, ``port``, ``folder`` (config, data, log).
    """

    def __init__(self, config: dict, folder: Path | None = None, bin_dir: Path | None = None):
        self.config = config
        self.bin_dir = Path(bin_dir) if bin_dir else None
        self._own_folder = folder is None
        self.folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="astro-e2e-prometheus-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.daemon: Daemon | None = None

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> "PrometheusServer":
        if self.bin_dir:
            prometheus, promtool_bin = self.bin_dir / "prometheus", self.bin_dir / "promtool"
        else:
            prometheus, promtool_bin = binaries()
        config_file = self.folder / "prometheus.yml"
        config_file.write_text(json.dumps(self.config, indent=2))
        check = subprocess.run([str(promtool_bin), "check", "config", str(config_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if check.returncode != 0:
            raise StartupError(f"promtool check config failed:\n{check.stdout}")
        data = self.folder / "data"
        data.mkdir(exist_ok=True)
        argv = [
            str(prometheus),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=info",
        ]
        self.daemon = Daemon("prometheus", argv, dict(os.environ), self.folder / "prometheus.log", cwd=self.folder)
        self.daemon.start()
        try:
            wait_for(lambda: self.daemon.check_alive() or self._ready(), timeout, "prometheus to be ready",
                     interval=0.2, on_timeout=lambda: self.daemon.tail(40))
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:  # refused, or 503 while starting (HTTPError is an OSError)
            return False

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its folder if we made it. Idempotent."""
        if self.daemon is not None:
            self.daemon.stop(timeout=30)
        if self._own_folder and not os.environ.get("ASTRO_E2E_KEEP"):
            shutil.rmtree(self.folder, ignore_errors=True)

    def log(self, lines: int = 60) -> str:
        return self.daemon.tail(lines) if self.daemon else ""

    # ---- HTTP API ------------------------------------------------------------------------

    def api(self, path: str, params: Iterable[tuple[str, Any]] | dict = (), expr: str | None = None) -> Any:
        """GET /api/v1/<path>; the ``data`` of a success answer, :class:`PromQLError` otherwise."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:  # 400/422/503 carry a JSON error body
            text = e.read().decode()
        try:
            body = json.loads(text)
        except ValueError:
            raise PromQLError("bad_response", text[:2000], expr) from None
        if body.get("status") != "success":
            raise PromQLError(body.get("errorType", "?"), body.get("error", text[:2000]), expr)
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query; the result vector as ``[{"metric": {...}, "value": [ts, "v"]}, ...]``."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", params, expr=expr)
        if data["resultType"] != "vector":
            # Scalars and strings come as a bare [ts, value].
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def series(self, match: str) -> list[dict]:
        return self.api("series", [("match[]", match)], expr=match)

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params = [("match[]", match)] if match else []
        return self.api(f"label/{label}/values", params, expr=match)

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]

    def rule_groups(self) -> list[dict]:
        return self.api("rules")["groups"]
