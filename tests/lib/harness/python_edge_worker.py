"""The real Python ``airflow edge worker`` — the benchmark anchor astro-agent is compared with.

    worker = PythonEdgeWorker(stack, name="py-1", queues=["default"], concurrency=8).start()
    ...
    worker.stop()          # SIGINT = the Python worker's drain; SIGTERM would fail running tasks

It runs from the airflow venv with :meth:`AirflowStack.worker_env` plus what the
Python worker needs on top (Edge API URL, Execution API URL and — unlike a task —
the JWT secret), in its own process group, PID recorded, output in
``<stack.workdir>/workers/<name>/worker.log``.

Facts (provider 5.1.0, checked with ``airflow edge worker --help``): ``-q`` comma
separated queues (all queues when omitted), ``-c`` concurrency, ``-H`` the worker
name (default: the FQDN), ``--pid`` the pid file (default under AIRFLOW_HOME; one
per worker, so two workers need two files).
"""

from __future__ import annotations

import signal
from typing import Sequence

from harness.airflow_stack import AirflowStack
from harness.procs import Daemon, StartupError, wait_for


class PythonEdgeWorker:
    def __init__(
        self,
        stack: AirflowStack,
        name: str = "python-edge-worker",
        queues: Sequence[str] = ("default",),
        concurrency: int = 8,
        api_base: str | None = None,
    ):
        """``api_base`` replaces the stack's api-server address for the Edge API; the Execution
        API the tasks use stays the stack's."""
        self.stack = stack
        self.edge_api_url = f"{api_base}/edge_worker/v1" if api_base else stack.edge_api_url
        self.name = name
        self.queues = list(queues)
        self.concurrency = concurrency
        self.folder = stack.worker_dir(name)
        self.daemon: Daemon | None = None

    @property
    def pid(self) -> int | None:
        return self.daemon.pid if self.daemon else None

    @property
    def log_file(self):
        return self.folder / "worker.log"

    def env(self) -> dict[str, str]:
        env = self.stack.worker_env(self.name)
        env.update(
            PYTHONUNBUFFERED="1",
            AIRFLOW__CORE__EXECUTOR="airflow.providers.edge3.executors.EdgeExecutor",
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__EDGE__API_URL=f"{self.edge_api_url}/rpcapi",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=self.stack.execution_api_url,
            AIRFLOW__API_AUTH__JWT_SECRET=self.stack.jwt_secret,
        )
        return env

    def start(self, wait: bool = True, timeout: float = 90.0) -> "PythonEdgeWorker":
        """Start the worker; with ``wait``, return once Airflow lists it as idle/running."""
        argv = [
            str(self.stack.airflow_bin_dir / "airflow"), "edge", "worker",
            "-H", self.name,
            "-q", ",".join(self.queues),
            "-c", str(self.concurrency),
            "--pid", str(self.folder / "worker.pid"),
        ]
        self.daemon = Daemon(f"edge worker {self.name}", argv, self.env(), self.log_file, cwd=self.folder).start()
        if wait:
            try:
                wait_for(
                    lambda: self.daemon.check_alive() or self._registered(),
                    timeout,
                    f"Python edge worker {self.name} to register",
                    interval=0.5,
                    on_timeout=lambda: self.daemon.tail(40),
                )
            except (StartupError, TimeoutError):
                self.daemon.stop()
                raise
        return self

    def _registered(self) -> bool:
        worker = self.stack.client.edge_worker(self.name)
        return bool(worker and worker["state"] in ("idle", "running"))

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120.0) -> int | None:
        """Stop the worker's process group: SIGINT (drain: running tasks finish) by default,
        SIGKILL after ``timeout``. Returns the exit code."""
        return self.daemon.stop(sig=sig, timeout=timeout) if self.daemon else None
