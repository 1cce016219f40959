"""Starting the real ``astro-agent`` binary against the test stack.

The binary is ``$ASTRO_AGENT_BIN``, ``$ASTRO_RELEASE_DIR/astro-agent`` or ``<cargo target dir>/release/astro-agent``
(``tests/run.sh`` builds it before pytest starts).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Sequence

from harness.airflow_stack import PASSWORD, USERNAME, AirflowStack
from harness.procs import Daemon, StartupError, free_port, wait_for

REPO = Path(__file__).resolve().parents[3]


def binary(name: str) -> Path:
    override = os.environ.get(f"{name.upper().replace('-', '_')}_BIN")
    if override:
        return Path(override)
    # tests/lib/cargo-target.sh's build, else a plain `cargo build --release`
    release = os.environ.get("ASTRO_RELEASE_DIR") or Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release"
    path = Path(release) / name
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `cargo build --release` first")
    return path


class AstroAgent:
    """One astro-agent process with its own worker folder, admin port and log file."""

    def __init__(
        self,
        stack: AirflowStack,
        name: str,
        queues: Sequence[str] = ("default",),
        sync_slots: int = 4,
        extra_args: Sequence[str] = (),
        queue_stats: bool = True,
        heartbeat_interval: str = "2s",
        launch_mode: str = "prefork",
        python: Path | None = None,
        api_base: str | None = None,
        program: Path | None = None,
    ):
        """``api_base`` replaces the stack's api-server address for the Edge and REST API (an
        https one, say); the Execution API the tasks use stays the stack's. ``program``: another
        build of the binary (a benchmark's baseline)."""
        self.stack = stack
        self.name = name
        self.queues = list(queues)
        self.folder = stack.worker_dir(name)
        self.port = free_port()
        argv = [
            str(program or binary("astro-agent")),
            "--api-url", f"{api_base}/edge_worker/v1" if api_base else stack.edge_api_url,
            "--execution-api-url", stack.execution_api_url,
            "--worker-name", name,
            "--queues", ",".join(self.queues),
            "--sync-slots", str(sync_slots),
            "--listen", f"127.0.0.1:{self.port}",
            "--python", str(python or stack.python),
            "--launch-mode", launch_mode,
            "--log-folder", str(stack.worker_log_folder(name)),
            "--heartbeat-interval", heartbeat_interval,
            *extra_args,
        ]
        env = stack.worker_env(name)
        env["ASTRO_AGENT_JWT_SECRET_FILE"] = str(stack.jwt_secret_file)
        env["RUST_LOG"] = "info"
        # As for the Python worker: tasks must not load Airflow's example DAGs and plugins.
        env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        if queue_stats:
            env["ASTRO_AGENT_REST_API_URL"] = api_base or stack.api_base
            env["ASTRO_AGENT_REST_API_USERNAME"] = USERNAME
            env["ASTRO_AGENT_REST_API_PASSWORD"] = PASSWORD
        self.daemon = Daemon(f"astro-agent {name}", argv, env, self.folder / "agent.log", cwd=self.folder)

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "AstroAgent":
        """Start and wait until /readyz answers 200 (registered with Airflow)."""
        self.daemon.start()
        try:
            wait_for(
                lambda: self.daemon.check_alive() or self.status("/readyz") == 200,
                timeout,
                f"astro-agent {self.name} to be ready",
                interval=0.1,
                on_timeout=lambda: self.daemon.tail(40),
            )
        except (StartupError, TimeoutError):
            self.daemon.stop(sig=signal.SIGKILL)
            raise
        return self

    def drain_then_stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (the drain); if it has not exited within 3 s, a second SIGTERM stops its
        tasks, so that no task outlives the caller; then wait for it."""
        if self.daemon.alive():
            self.send_signal(signal.SIGTERM)
            try:
                self.wait(3)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGTERM)
        self.stop(timeout=timeout)

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.admin + path, timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def metrics(self) -> str:
        with urllib.request.urlopen(self.admin + "/metrics", timeout=5) as r:
            return r.read().decode()

    def gauge(self, name: str, **labels: str) -> float | None:
        """The value of one sample of /metrics, or None when absent."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = re.compile(rf"^{re.escape(name)}(\{{(.*)\}})? (\S+)$")
        for line in self.metrics().splitlines():
            m = pattern.match(line)
            if not m:
                continue
            have = ",".join(sorted((m.group(2) or "").split(","))) if m.group(2) else ""
            if have == want:
                return float(m.group(3))
        return None

    def launcher_pids(self) -> list[int]:
        """PIDs of this agent's pre-forked launcher processes: children of its task host (the
        agent's child) running the script in launcher mode (not a fresh interpreter's
        ``--one``)."""
        processes: dict[int, tuple[int, bytes]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            processes[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
        task_hosts = {pid for pid, (ppid, cmdline) in processes.items()
                      if ppid == self.daemon.pid and b"task-host" in cmdline}
        return [pid for pid, (ppid, cmdline) in processes.items()
                if ppid in task_hosts and cmdline.split(b"\0")[3:4] == [b"astro-launcher"]
                and b"--one" not in cmdline.split(b"\0")[4:5]]

    def send_signal(self, sig: int) -> None:
        self.daemon.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.daemon.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> int | None:
        return self.daemon.stop(sig=sig, timeout=timeout)

    def log(self) -> str:
        return self.daemon.tail(200)
