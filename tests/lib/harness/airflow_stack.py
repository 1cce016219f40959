"""A real Apache Airflow 3 + Edge executor on PostgreSQL, for end-to-end tests.

    stack = AirflowStack().start()      # 15-20 s on an idle 2-core machine; builds the
                                        # airflow venv first if it is not cached (~1 min)
    try:
        client = stack.client           # REST client (see airflow_client.py)
        ...
    finally:
        stack.stop()

What runs: a private PostgreSQL cluster, ``airflow db migrate``, then
``airflow api-server``, ``airflow scheduler`` and ``airflow dag-processor``, each in
its own process group with its PID recorded and its output in
``<workdir>/<name>.log``. Everything lives in one temp folder that :meth:`stop`
removes (set ``ASTRO_E2E_KEEP=1`` to keep it for a post-mortem).

Airflow settings that matter for tests:
* executor ``EdgeExecutor``, Edge Worker API enabled, a fresh random JWT secret
  (64 random bytes, url-safe text) per stack;
* SimpleAuthManager with user ``admin`` / password ``admin`` (:data:`USERNAME`, :data:`PASSWORD`);
* DAGS_FOLDER = tests/e2e/dags, no example DAGs, parallelism / pool / per-DAG
  limits at 512 so whole runs get queued at once, the DAG folder rescanned every 5 s.

Workers (astro-agent, the Python edge worker) get :meth:`worker_env`: their own
AIRFLOW_HOME and their own BASE_LOG_FOLDER, the DAGs folder and the airflow venv
on PATH — but no database URL and no JWT secret. Their log folder is deliberately
not the api-server's :attr:`log_folder`: a task log the REST API shows can only
have got there through the Edge API's ``logs/push``.

Test hygiene: :meth:`AirflowStack.abandon_run` makes a test's unfinished run harmless
for later tests; :meth:`AirflowStack.sql` runs SQL on the metadata database for
set-up/inspection. :meth:`stop_api_server` / :meth:`start_api_server` restart only
the api-server, on the same port.

Sharing: :meth:`state` describes a running stack and :meth:`AirflowStack.attach` makes a
stack object of it in another process (the e2e stage's pytest processes share one stack
that way, see tests/e2e/conftest.py). An attached stack has the same addresses, secrets,
environments, :meth:`sql` and :meth:`abandon_run`; it has no daemons of its own to stop or
restart, and its :meth:`stop` leaves the stack running for the process that started it.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import requests

from harness.airflow_client import AirflowClient
from harness.postgres import PostgresCluster
from harness.procs import Daemon, StartupError, free_port, log_tail, starting, wait_for

TESTS_DIR = Path(__file__).resolve().parents[2]
DAGS_FOLDER = TESTS_DIR / "e2e" / "dags"
USERNAME = "admin"
PASSWORD = "admin"
EXECUTOR = "airflow.providers.edge3.executors.EdgeExecutor"


#: A requirements file in place of tests/requirements-airflow.txt: another Airflow and Edge
#: provider (the compatibility matrix, tests/compat/run.sh, sets it).
REQUIREMENTS_OVERRIDE = "ASTRO_AIRFLOW_REQUIREMENTS"


def airflow_venv() -> Path:
    """Path of the cached venv with Airflow + the Edge provider (built on first use)."""
    override = os.environ.get(REQUIREMENTS_OVERRIDE)
    out = subprocess.run(
        ["bash", str(TESTS_DIR / "lib" / "venvs.sh"), "airflow", *([override] if override else [])],
        check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    return Path(out.strip().splitlines()[-1])


def _clean_environ() -> dict[str, str]:
    """os.environ without any AIRFLOW* variable, so the caller's shell cannot leak config in."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}


class AirflowStack:
    """Starts and stops one Airflow deployment. All attributes are valid after :meth:`start`.

    Attributes:
        api_base: ``http://HOST:PORT`` (public REST API, UI, auth; HOST is 127.0.0.1 unless given).
        edge_api_url: ``{api_base}/edge_worker/v1`` — astro-agent's ``--api-url``.
        execution_api_url: ``{api_base}/execution/`` — astro-agent's ``--execution-api-url``.
        jwt_secret: the ``[api_auth] jwt_secret`` (text); ``jwt_secret_file`` holds the same
            value without a trailing newline (mode 0600) for ``--jwt-secret-file``.
        log_folder: the api-server's BASE_LOG_FOLDER (where pushed logs land).
        postgres_url: ``postgres://airflow:PASSWORD@127.0.0.1:PORT/airflow`` (password auth).
        airflow_bin_dir: ``<airflow venv>/bin`` (``python``, ``airflow``).
        python: ``<airflow venv>/bin/python`` — astro-agent's ``--python``.
        workdir: the temp folder holding everything.
        timings: seconds spent in each start-up phase (``venv``, ``postgres``, ``migrate``,
            ``daemons``, ``total``).
    """

    def __init__(
        self,
        dags_folder: Path = DAGS_FOLDER,
        extra_env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
    ):
        self.dags_folder = Path(dags_folder)
        # The api-server's address: the cluster stage's pods reach it on a non-loopback one.
        self.host = host
        self.extra_env = dict(extra_env or {})
        self.workdir: Path | None = None
        self.port: int | None = None
        self.jwt_secret = secrets.token_urlsafe(64)
        self.timings: dict[str, float] = {}
        self._pg: PostgresCluster | None = None
        self._venv: Path | None = None
        self._daemons: dict[str, Daemon] = {}
        self._client: AirflowClient | None = None
        self._stopped = False
        #: True for a stack another process started (:meth:`attach`).
        self.attached = False

    # ---- addresses -------------------------------------------------------------------

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def edge_api_url(self) -> str:
        return f"{self.api_base}/edge_worker/v1"

    @property
    def execution_api_url(self) -> str:
        return f"{self.api_base}/execution/"

    @property
    def postgres_url(self) -> str:
        return self._pg.url

    @property
    def airflow_bin_dir(self) -> Path:
        return self._venv / "bin"

    @property
    def python(self) -> Path:
        return self.airflow_bin_dir / "python"

    @property
    def log_folder(self) -> Path:
        return self.workdir / "logs"

    @property
    def jwt_secret_file(self) -> Path:
        return self.workdir / "secrets" / "jwt_secret"

    @property
    def client(self) -> AirflowClient:
        """A REST client logged in as admin (shared; create more with :meth:`new_client`)."""
        if self._client is None:
            self._client = self.new_client()
        return self._client

    def new_client(self) -> AirflowClient:
        return AirflowClient(self.api_base, USERNAME, PASSWORD)

    def daemon(self, name: str) -> Daemon:
        """The running ``api-server``, ``scheduler`` or ``dag-processor`` (PID, log file)."""
        self._own_daemons()
        return self._daemons[name]

    def _own_daemons(self) -> None:
        if self.attached:
            raise RuntimeError("this stack was started by another process: its daemons are not this process's")

    # ---- sharing with other processes ------------------------------------------------

    def state(self) -> dict:
        """A running stack's coordinates and secrets, for :meth:`attach` in another process
        (plain JSON types; it holds the JWT secret: hand it over privately, not in the environment)."""
        return {
            "dags_folder": str(self.dags_folder),
            "host": self.host,
            "extra_env": self.extra_env,
            "workdir": str(self.workdir),
            "port": self.port,
            "jwt_secret": self.jwt_secret,
            "fernet_key": self._fernet_key,
            "api_secret_key": self._api_secret_key,
            "venv": str(self._venv),
            "timings": self.timings,
            "postgres": self._pg.state(),
        }

    @classmethod
    def attach(cls, state: dict) -> "AirflowStack":
        """The stack another process started and described with :meth:`state`."""
        stack = cls(Path(state["dags_folder"]), extra_env=state["extra_env"], host=state["host"])
        stack.attached = True
        stack.workdir = Path(state["workdir"])
        stack.port = state["port"]
        stack.jwt_secret = state["jwt_secret"]
        stack._fernet_key = state["fernet_key"]
        stack._api_secret_key = state["api_secret_key"]
        stack._venv = Path(state["venv"])
        stack.timings = dict(state["timings"])
        stack._pg = PostgresCluster.attach(state["postgres"])
        return stack

    # ---- environments ----------------------------------------------------------------

    def server_env(self) -> dict[str, str]:
        """Full environment of the Airflow daemons (includes DB URL and JWT secret)."""
        env = _clean_environ()
        env.update(
            PATH=f"{self.airflow_bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
            PYTHONUNBUFFERED="1",
            AIRFLOW_HOME=str(self.workdir / "home"),
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=self._pg.sqlalchemy_url,
            # Room for every request in flight. Airflow 3.3.2's api-server checks a token's
            # revocation with a blocking query on its event loop: once the pool's 15 connections
            # (5 + 10 overflow) are held by requests suspended on that loop, the loop waits for a
            # connection forever and the api-server answers nothing again (seen in the cluster
            # stage: 15 sessions "idle in transaction", the main thread in RevokedToken.is_revoked).
            AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE="10",
            AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW="200",  # each stack has its own PostgreSQL (300 connections)
            AIRFLOW__CORE__EXECUTOR=EXECUTOR,
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags_folder),
            AIRFLOW__CORE__FERNET_KEY=self._fernet_key,
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=self.execution_api_url,
            AIRFLOW__CORE__PARALLELISM="512",
            AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG="512",
            # Only read when `db migrate` creates default_pool (128 slots otherwise).
            AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT="512",
            AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY="512",
            AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{USERNAME}:admin",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(self.workdir / "secrets" / "passwords.json"),
            AIRFLOW__API__BASE_URL=self.api_base,
            AIRFLOW__API__SECRET_KEY=self._api_secret_key,
            AIRFLOW__API_AUTH__JWT_SECRET=self.jwt_secret,
            AIRFLOW__EDGE__API_ENABLED="True",
            AIRFLOW__EDGE__API_URL=f"{self.edge_api_url}/rpcapi",
            AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(self.log_folder),
            # Default 300 s: a DAG file added while the stack runs would take minutes to appear.
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
        )
        env.update(self.extra_env)
        return env

    def worker_dir(self, name: str) -> Path:
        """Private folder of worker ``name`` (its AIRFLOW_HOME and log folder live inside)."""
        path = self.workdir / "workers" / name
        (path / "home").mkdir(parents=True, exist_ok=True)
        (path / "logs").mkdir(parents=True, exist_ok=True)
        return path

    def worker_log_folder(self, name: str = "worker") -> Path:
        """BASE_LOG_FOLDER of worker ``name`` — astro-agent's ``--log-folder``."""
        return self.worker_dir(name) / "logs"

    def worker_env(self, name: str = "worker") -> dict[str, str]:
        """Full environment for a worker host called ``name`` (one folder per name).

        The caller's environment minus any AIRFLOW* variable, plus: PATH with the airflow
        venv's bin first, AIRFLOW_HOME, AIRFLOW__CORE__DAGS_FOLDER and
        AIRFLOW__LOGGING__BASE_LOG_FOLDER. No database URL, no JWT secret, no Edge or
        Execution API URL: whoever runs the worker adds what it needs.
        """
        folder = self.worker_dir(name)
        env = _clean_environ()
        env.update(
            PATH=f"{self.airflow_bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
            AIRFLOW_HOME=str(folder / "home"),
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags_folder),
            AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(folder / "logs"),
        )
        return env

    # ---- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> "AirflowStack":
        """Bring everything up; raise with the failing daemon's log tail on failure.

        On failure everything already started is stopped before the error propagates.
        """
        atexit.register(self.stop)
        with starting(self) as mark:
            self._venv = airflow_venv()
            mark("venv")
            self._prepare_workdir()
            self._pg = PostgresCluster(self.workdir / "pg").start()
            mark("postgres")
            self.port = free_port()
            self._migrate(timeout)
            mark("migrate")
            for name in ("api-server", "scheduler", "dag-processor"):
                self._start_daemon(name)
            self._wait_healthy(timeout, need_scheduler=True)
            mark("daemons")
        return self

    def stop(self) -> None:
        """Stop the daemons (SIGTERM, then SIGKILL after 20 s), Postgres, remove the folder. Idempotent.
        An attached stack is left running: the process that started it stops it."""
        if self._stopped:
            return
        self._stopped = True
        if self.attached:
            return
        for name in ("scheduler", "dag-processor", "api-server"):
            daemon = self._daemons.get(name)
            if daemon is not None:
                daemon.stop()
        if self._pg is not None:
            try:
                self._pg.stop()
            except Exception as e:  # keep tearing down
                print(f"postgres stop failed: {e}")
        if self.workdir is not None:
            if os.environ.get("ASTRO_E2E_KEEP"):
                print(f"ASTRO_E2E_KEEP set: keeping {self.workdir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_api_server(self) -> None:
        """Stop only the api-server (scheduler and dag-processor keep running)."""
        self._own_daemons()
        self._daemons["api-server"].stop()

    def start_api_server(self, timeout: float = 120.0) -> None:
        """Start the api-server again on the same port and wait until it is healthy."""
        self._own_daemons()
        self._start_daemon("api-server")
        self._wait_healthy(timeout, need_scheduler=False)

    # ---- test hygiene ----------------------------------------------------------------

    def sql(self, statement: str) -> str:
        """Run one SQL statement on the metadata database (as superuser, over the unix
        socket); return psql's unaligned, tuples-only output. For test set-up and
        clean-up only — workers never get database access."""
        return self._pg.psql(statement, database=self._pg.database)

    def abandon_run(self, dag_id: str, run_id: str) -> None:
        """Make an unfinished run harmless for later tests.

        Sets the run to ``failed`` through the REST API (Airflow then marks its queued and
        scheduled task instances ``skipped``) and deletes its still-``queued`` edge_job rows:
        Airflow leaves those rows ``queued``, so a worker started later for that queue would
        otherwise still be handed jobs of skipped task instances.
        """
        if self.client.dag_run(dag_id, run_id)["state"] not in ("success", "failed"):
            self.client.set_run_state(dag_id, run_id, "failed")
        self.sql(
            "DELETE FROM edge_job WHERE state = 'queued' "
            f"AND dag_id = {_sql_literal(dag_id)} AND run_id = {_sql_literal(run_id)}"
        )

    # ---- internals -------------------------------------------------------------------

    def _prepare_workdir(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="astro-e2e-airflow-"))
        # Traversable but not listable by others: the postgres user must reach pg/.
        os.chmod(self.workdir, 0o711)
        for sub in ("home", "logs", "workers"):
            (self.workdir / sub).mkdir()
        secrets_dir = self.workdir / "secrets"
        secrets_dir.mkdir(mode=0o700)
        (secrets_dir / "passwords.json").write_text(f'{{"{USERNAME}": "{PASSWORD}"}}')
        self.jwt_secret_file.write_text(self.jwt_secret)
        os.chmod(self.jwt_secret_file, 0o600)
        self._fernet_key = _fernet_key()
        self._api_secret_key = secrets.token_urlsafe(32)

    def _migrate(self, timeout: float) -> None:
        log = self.workdir / "db-migrate.log"
        with open(log, "wb") as out:
            result = subprocess.run(
                [str(self.airflow_bin_dir / "airflow"), "db", "migrate"],
                env=self.server_env(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        if result.returncode != 0:
            raise StartupError(f"airflow db migrate exited {result.returncode}; log {log}:\n{log_tail(log)}")

    def _start_daemon(self, name: str) -> None:
        argv = [str(self.airflow_bin_dir / "airflow"), name]
        if name == "api-server":
            argv += ["-H", self.host, "-p", str(self.port)]
        daemon = Daemon(name, argv, self.server_env(), self.workdir / f"{name}.log", cwd=self.workdir)
        self._daemons[name] = daemon.start()

    def _wait_healthy(self, timeout: float, need_scheduler: bool) -> None:
        """Poll the health endpoints; fail fast (with its log) if a daemon dies."""

        def healthy():
            for daemon in self._daemons.values():
                daemon.check_alive()
            try:
                health = requests.get(f"{self.api_base}/api/v2/monitor/health", timeout=5)
                edge = requests.get(f"{self.edge_api_url}/health", timeout=5)
            except requests.RequestException:
                return False
            if health.status_code != 200 or edge.status_code != 200:
                return False
            if edge.json().get("status") != "healthy":
                return False
            body = health.json()
            parts = ["metadatabase"] + (["scheduler", "dag_processor"] if need_scheduler else [])
            return all((body.get(p) or {}).get("status") == "healthy" for p in parts)

        def tails():
            return "\n".join(f"== {n} ({d.log_file}):\n{d.tail(25)}" for n, d in self._daemons.items())

        wait_for(healthy, timeout, "Airflow health endpoints", interval=0.3, on_timeout=tails)
        # The Execution API app is built lazily on its first request (~4 s on a busy
        # 2-core machine); pay that here rather than in the first task's start-up.
        wait_for(
            lambda: _get_ok(f"{self.execution_api_url}health", timeout=60),
            timeout,
            "the Execution API",
            on_timeout=tails,
        )


def _get_ok(url: str, timeout: float) -> bool:
    try:
        return requests.get(url, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _fernet_key() -> str:
    import base64

    return base64.urlsafe_b64encode(os.urandom(32)).decode()
