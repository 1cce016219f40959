"""A tiny stand-in for Airflow's REST API v2 task-instance list, for benchmarks and metric
checks that must run without a real Airflow.

    python3 fake_airflow.py PORT_FILE

Listens on 127.0.0.1 on a free port (written to PORT_FILE once listening) and answers
``GET /api/v2/dags/~/dagRuns/~/taskInstances?queue=Q&state=S&limit=L&offset=O`` with a page of at
most 100 task instances (Airflow's default ``maximum_page_limit``) and ``total_entries``. Each
queue holds a stable number of task instances in each state, derived from the queue and state
(below 50, so one page lists a queue's queued and running ones). Every other path of Airflow's
API it answers 404. It counts what it was asked and reports it at ``GET /requests``:
``backlog_lists`` (listings of queued and running task instances), ``held_counts`` (counts of
``scheduled`` ones, the tasks Airflow holds back) and ``other`` (the rest: executor callbacks,
the Edge worker list, ...).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

PATH = "/api/v2/dags/~/dagRuns/~/taskInstances"
PAGE_LIMIT = 100
served = {"backlog_lists": 0, "held_counts": 0, "other": 0}
lock = threading.Lock()


def entries(queue: str, state: str) -> int:
    return zlib.crc32(f"{queue}/{state}".encode()) % 50


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/requests":
            with lock:
                return self._send(200, dict(served))
        q = parse_qs(url.query)
        kind = "other" if url.path != PATH else "held_counts" if q.get("state") == ["scheduled"] else "backlog_lists"
        with lock:
            served[kind] += 1
        if url.path != PATH:
            return self._send(404, {"detail": "Not Found"})
        if not self.headers.get("Authorization", "").startswith("Bearer "):
            return self._send(401, {"detail": "Not authenticated"})
        queue = q.get("queue", [""])[0]
        listed = [
            {"id": f"{queue}/{state}/{i}", "state": state, "pool_slots": 1, "hostname": None,
             "queued_when": "2024-01-01T00:00:00Z"}
            for state in q.get("state", [""])
            for i in range(entries(queue, state))
        ]
        offset, limit = int(q.get("offset", ["0"])[0]), int(q.get("limit", ["100"])[0])
        page = listed[offset:offset + min(limit, PAGE_LIMIT)]
        self._send(200, {"task_instances": page, "total_entries": len(listed)})


def start(work: Path) -> tuple["Daemon", str]:
    """Runs this fake as a process writing under ``work``: the process (stop it) and its URL."""
    from harness.procs import Daemon, wait_for

    port_file = work / "fake.port"
    fake = Daemon("fake-airflow", [sys.executable, __file__, str(port_file)], dict(os.environ),
                  work / "fake.log").start()
    wait_for(lambda: fake.check_alive() or (port_file.exists() and port_file.read_text()), 10, "fake API")
    return fake, f"http://127.0.0.1:{port_file.read_text()}"


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
