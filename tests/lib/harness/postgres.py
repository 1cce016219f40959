"""A private, throw-away PostgreSQL cluster for one test session.

Uses the server binaries of Debian's ``postgresql`` package (installed with apt
when missing). The cluster lives in a folder of its own, listens on 127.0.0.1 on
a free port, keeps its unix socket in that folder, and needs no system service.
PostgreSQL refuses to run as root, so when we are root the server runs as the
``postgres`` user and the folder is chowned to it.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
from pathlib import Path

from harness.procs import apt_lock, free_port, log_tail, wait_for


def postgres_bin_dir() -> Path:
    """Folder holding initdb/pg_ctl/psql, installing Debian's postgresql if needed."""
    found = _find_bin_dir()
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("PostgreSQL server binaries not found and not root: apt-get install postgresql")
    with apt_lock():
        found = _find_bin_dir()
        if found:
            return found
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    found = _find_bin_dir()
    if not found:
        raise RuntimeError("apt-get installed postgresql but no /usr/lib/postgresql/*/bin/initdb exists")
    return found


def _find_bin_dir() -> Path | None:
    candidates = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not candidates:
        return None
    # Highest major version first.
    candidates.sort(key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(candidates[-1]).parent


class PostgresCluster:
    """initdb + pg_ctl start in ``folder``; one login role and one database.

    After :meth:`start`: ``port``, ``user``, ``password``, ``database`` and the
    URLs :attr:`url` (``postgres://…``, for libpq-style clients such as a Rust
    client) and :attr:`sqlalchemy_url` (for Airflow).
    """

    def __init__(self, folder: Path, user: str = "airflow", database: str = "airflow"):
        self.folder = Path(folder)
        self.user = user
        self.database = database
        self.password = secrets.token_hex(16)
        self.port: int | None = None
        self.bin_dir: Path | None = None
        self.data_dir = self.folder / "data"
        self.log_file = self.folder / "postgres.log"
        self._run_as: pwd.struct_passwd | None = None
        self._started = False

    @property
    def url(self) -> str:
        return f"postgres://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    @property
    def sqlalchemy_url(self) -> str:
        return f"postgresql+psycopg2://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    def start(self) -> "PostgresCluster":
        self.bin_dir = postgres_bin_dir()
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            self._run_as = pwd.getpwnam("postgres")
            os.chown(self.folder, self._run_as.pw_uid, self._run_as.pw_gid)
        os.chmod(self.folder, 0o700)
        # Local socket connections are trusted (only the folder's owner can reach
        # the socket); TCP needs the role's password.
        self._pg(
            "initdb", "-D", str(self.data_dir), "-U", "postgres", "-E", "UTF8",
            "--auth-local=trust", "--auth-host=scram-sha-256",
        )
        self.port = free_port()
        opts = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=300"
        try:
            self._pg("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", opts, "-w", "-t", "60", "start")
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{log_tail(self.log_file)}") from e
        self._started = True
        self.psql(f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}'")
        self.psql(f"CREATE DATABASE {self.database} OWNER {self.user}")
        return self

    def state(self) -> dict:
        """What :meth:`attach` needs to reach this running cluster from another process."""
        return {
            "folder": str(self.folder), "user": self.user, "database": self.database, "password": self.password,
            "port": self.port, "bin_dir": str(self.bin_dir),
            "run_as": self._run_as.pw_name if self._run_as is not None else None,
        }

    @classmethod
    def attach(cls, state: dict) -> "PostgresCluster":
        """The cluster another process started (:meth:`state`): :meth:`psql` works, :meth:`stop`
        does nothing (the process that started it stops it)."""
        pg = cls(Path(state["folder"]), user=state["user"], database=state["database"])
        pg.password = state["password"]
        pg.port = state["port"]
        pg.bin_dir = Path(state["bin_dir"])
        pg._run_as = pwd.getpwnam(state["run_as"]) if state["run_as"] else None
        return pg

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run one SQL statement as the superuser over the unix socket; return stdout."""
        return self._pg(
            "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
            "-h", str(self.folder), "-p", str(self.port), "-U", "postgres", "-d", database, "-c", sql,
        )

    def enable_tls(self, certificate: Path, key: Path) -> None:
        """Turn ``ssl`` on with this server certificate and key (a reload, no restart)."""
        server_crt, server_key = self.folder / "tls-server.crt", self.folder / "tls-server.key"
        shutil.copy(certificate, server_crt)
        shutil.copy(key, server_key)
        os.chmod(server_key, 0o600)  # PostgreSQL refuses a key others can read
        if self._run_as is not None:
            for f in (server_crt, server_key):
                os.chown(f, self._run_as.pw_uid, self._run_as.pw_gid)
        self.psql(f"ALTER SYSTEM SET ssl_cert_file = '{server_crt}'")
        self.psql(f"ALTER SYSTEM SET ssl_key_file = '{server_key}'")
        self.psql("ALTER SYSTEM SET ssl = on")
        self.psql("SELECT pg_reload_conf()")
        wait_for(lambda: self.psql("SHOW ssl").strip() == "on", 10, "ssl = on")

    def disable_tls(self) -> None:
        for setting in ("ssl", "ssl_cert_file", "ssl_key_file"):
            self.psql(f"ALTER SYSTEM RESET {setting}")
        self.psql("SELECT pg_reload_conf()")

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            self._pg("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", "stop")
        except RuntimeError:
            self._pg("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop", check=False)

    def _pg(self, tool: str, *args: str, check: bool = True) -> str:
        argv = [str(self.bin_dir / tool), *args]
        kwargs: dict = {}
        if self._run_as is not None:
            kwargs = dict(user=self._run_as.pw_uid, group=self._run_as.pw_gid, extra_groups=[])
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "HOME": str(self.folder)}
        result = subprocess.run(
            argv, cwd=self.folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, **kwargs
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{tool} exited {result.returncode}: {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout
