"""The Sentinel the benchmark's ``astro-agent-wake`` workers subscribe to: the real
``astro-sentinel`` binary reading the stack's metadata database (``postgres`` source, one query
for every queue, refreshed every half second) through a read-only role, with a static agent
token for the queue-event stream."""

from __future__ import annotations

import json
import secrets
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from harness.astro_agent_process import binary
from harness.procs import Daemon, free_port, wait_for

REFRESH = "500ms"


class WakeSentinel:
    def __init__(self, stack, folder: Path, queues: list[str]):
        self.stack = stack
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.role, password = f"bench_ro_{secrets.token_hex(4)}", secrets.token_hex(16)
        self.token_file = folder / "agent-token"
        self.token_file.write_text(secrets.token_hex(24) + "\n")
        config = {
            "refreshInterval": REFRESH,
            "source": {"type": "postgres", "postgres": {"sslMode": "disable"}},
            # Nobody reads backlogs here; the agents' token opens the stream only.
            "auth": {"staticTokensFile": str(folder / "no-readers")},
            "queueEvents": {"auth": {"staticTokensFile": str(self.token_file)}},
            "workers": [{"name": "bench", "queues": queues, "syncSlots": 4}],
        }
        (folder / "no-readers").write_text("")
        (folder / "sentinel.yaml").write_text(json.dumps(config, indent=2))
        pg = urlparse(stack.postgres_url)
        self.daemon = Daemon(
            "astro-sentinel",
            [str(binary("astro-sentinel")), "--config", str(folder / "sentinel.yaml"),
             "--listen", f"127.0.0.1:{self.port}"],
            {"PATH": "/usr/bin:/bin", "RUST_LOG": "info",
             "ASTRO_SENTINEL_POSTGRES_URL": f"postgres://{self.role}:{password}@127.0.0.1:{pg.port}{pg.path}"},
            folder / "sentinel.log",
        )
        self._password = password

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "WakeSentinel":
        self.stack.sql(f"CREATE ROLE {self.role} LOGIN PASSWORD '{self._password}'")
        self.stack.sql(f"GRANT SELECT ON task_instance, edge_worker TO {self.role}")
        self.daemon.start()
        wait_for(lambda: self.daemon.check_alive() or self._ready(), 30, "the Sentinel's first refresh",
                 on_timeout=self.daemon.tail)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self) -> None:
        self.daemon.stop()
        try:
            self.stack.sql(f"DROP OWNED BY {self.role}")
            self.stack.sql(f"DROP ROLE {self.role}")
        except Exception:
            pass  # the stack may be stopping already
