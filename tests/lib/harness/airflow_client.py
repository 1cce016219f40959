"""Minimal client for Airflow 3's public REST API (v2) and the Edge provider's UI API.

Only what the end-to-end tests need: log in, make DAGs runnable, trigger runs,
read task instances / counts / logs, and the admin actions on edge workers
(maintenance, shutdown request, concurrency) that a worker must obey.

Auth: ``POST /auth/token`` with username/password returns a bearer token
(SimpleAuthManager, valid 24 h); on a 401 the client logs in again once.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterable

import requests

from harness.procs import wait_for

FINISHED_RUN_STATES = ("success", "failed")
#: Task-instance states that mean "will not change any more".
FINISHED_TI_STATES = ("success", "failed", "skipped", "upstream_failed", "removed")


class ApiError(RuntimeError):
    """An unexpected HTTP status; the message carries method, URL, status and body."""

    def __init__(self, response: requests.Response):
        self.status_code = response.status_code
        self.body = response.text
        super().__init__(
            f"{response.request.method} {response.url} -> {response.status_code}: {response.text[:2000]}"
        )


class AirflowClient:
    def __init__(self, api_base: str, username: str, password: str, timeout: float = 30.0):
        self.api_base = api_base.rstrip("/")
        self.username = username
        self.password = password
        self.timeout = timeout
        self.session = requests.Session()
        self._token: str | None = None
        self._ready_dags: set[str] = set()

    # ---- plumbing --------------------------------------------------------------------

    def login(self) -> str:
        """Fetch a new bearer token (also stored for later requests) and return it."""
        r = self.session.post(
            f"{self.api_base}/auth/token",
            json={"username": self.username, "password": self.password},
            timeout=self.timeout,
        )
        if r.status_code not in (200, 201):
            raise ApiError(r)
        self._token = r.json()["access_token"]
        return self._token

    @property
    def token(self) -> str:
        """The current bearer token (logs in on first use)."""
        return self._token or self.login()

    def request(self, method: str, path: str, ok: Iterable[int] = (200,), **kwargs) -> requests.Response:
        """``method`` on ``api_base + path`` with the bearer token; raise ApiError unless status in ``ok``."""
        kwargs.setdefault("timeout", self.timeout)
        extra_headers = kwargs.pop("headers", {})
        for attempt in (1, 2):
            headers = {**extra_headers, "Authorization": f"Bearer {self.token}"}
            r = self.session.request(method, f"{self.api_base}{path}", headers=headers, **kwargs)
            if r.status_code == 401 and attempt == 1:
                self.login()
                continue
            break
        if r.status_code not in tuple(ok):
            raise ApiError(r)
        return r

    def get(self, path: str, **params) -> Any:
        return self.request("GET", path, params=params).json()

    # ---- DAGs and runs ---------------------------------------------------------------

    def dag(self, dag_id: str) -> dict | None:
        """The DAG's record, or None while the dag-processor has not parsed it yet."""
        r = self.request("GET", f"/api/v2/dags/{dag_id}", ok=(200, 404))
        return r.json() if r.status_code == 200 else None

    def wait_dag(self, dag_id: str, timeout: float = 120.0) -> dict:
        """Poll until the dag-processor has serialized ``dag_id``."""
        return wait_for(lambda: self.dag(dag_id), timeout, f"DAG {dag_id} to be parsed", interval=0.5)

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})

    def ensure_runnable(self, dag_id: str, timeout: float = 120.0) -> None:
        """Wait for the DAG to be parsed and unpause it (once per client)."""
        if dag_id in self._ready_dags:
            return
        self.wait_dag(dag_id, timeout)
        self.unpause(dag_id)
        self._ready_dags.add(dag_id)

    def trigger(self, dag_id: str, run_id: str | None = None, conf: dict | None = None) -> str:
        """Start a manual run (logical_date null) and return its run id.

        ``run_id`` defaults to ``<dag_id>__<random hex>`` so tests never collide.
        """
        self.ensure_runnable(dag_id)
        run_id = run_id or f"{dag_id}__{uuid.uuid4().hex[:12]}"
        self.request(
            "POST",
            f"/api/v2/dags/{dag_id}/dagRuns",
            json={"dag_run_id": run_id, "logical_date": None, "conf": conf or {}},
        )
        return run_id

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 300.0) -> str:
        """Poll until the run is ``success`` or ``failed``; return that state."""

        def finished():
            state = self.dag_run(dag_id, run_id)["state"]
            return state if state in FINISHED_RUN_STATES else None

        def progress():
            tis = self.task_instances(dag_id, run_id)
            states: dict[str, int] = {}
            for ti in tis:
                states[str(ti["state"])] = states.get(str(ti["state"]), 0) + 1
            return f"task-instance states of {run_id}: {states}"

        return wait_for(finished, timeout, f"run {run_id} to finish", interval=1.0, on_timeout=progress)

    def set_run_state(self, dag_id: str, run_id: str, state: str = "failed") -> None:
        """Force a run to ``success``/``failed``/``queued`` (cleans up a test's leftovers)."""
        self.request("PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", json={"state": state})

    # ---- task instances --------------------------------------------------------------

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """All task instances of a run (each with task_id, map_index, state, queue,
        hostname, try_number, start_date, end_date, ...), paging through the API."""
        out: list[dict] = []
        while True:
            page = self.get(
                f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                limit=100,
                offset=len(out),
                order_by="id",
            )
            out.extend(page["task_instances"])
            if not page["task_instances"] or len(out) >= page["total_entries"]:
                return out

    def count(self, queue: str | None = None, states: Iterable[str] = (), dag_id: str = "~", run_id: str = "~") -> int:
        """Number of task instances on ``queue`` in any of ``states`` (all DAGs/runs by default).

        ``GET /api/v2/dags/~/dagRuns/~/taskInstances?queue=Q&state=S...&limit=0`` →
        ``total_entries``: the same query a backlog source makes.
        """
        params: list[tuple[str, Any]] = [("limit", 0)]
        if queue is not None:
            params.append(("queue", queue))
        params += [("state", s) for s in states]
        r = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params=params)
        return r.json()["total_entries"]

    def counts_by_state(self, queue: str, states: Iterable[str] = ("scheduled", "queued", "running", "success", "failed"), **kw) -> dict[str, int]:
        """``{state: count}`` on ``queue`` (one request per state)."""
        return {s: self.count(queue, [s], **kw) for s in states}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> dict:
        """The raw JSON answer of the task-log endpoint:
        ``{"content": [<entry>, ...], "continuation_token": ...}`` where an entry is a dict
        with at least ``event`` (the message) and usually ``timestamp``, ``level``, ``logger``."""
        return self.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            map_index=map_index,
            full_content="true",
        )

    def task_log_text(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        """The task log as plain text: one line per entry (its ``event``, or the entry itself)."""
        content = self.task_log(dag_id, run_id, task_id, try_number, map_index).get("content") or []
        lines = []
        for entry in content:
            if isinstance(entry, dict):
                lines.append(str(entry.get("event", entry)))
                lines.extend(str(s) for s in entry.get("sources", []) or [])
            else:
                lines.append(str(entry))
        return "\n".join(lines)

    # ---- edge workers (the provider's UI API; the same admin actions as the UI) -------

    def edge_workers(self) -> list[dict]:
        """Registered edge workers: worker_name, state, queues, jobs_active, sysinfo, last_heartbeat, ..."""
        return self.get("/edge_worker/ui/worker")["workers"]

    def edge_worker(self, name: str) -> dict | None:
        return next((w for w in self.edge_workers() if w["worker_name"] == name), None)

    def wait_edge_worker(self, name: str, states: Iterable[str] = ("idle", "running"), timeout: float = 60.0) -> dict:
        """Poll until worker ``name`` is registered and in one of ``states``."""
        wanted = tuple(states)

        def check():
            w = self.edge_worker(name)
            return w if w and w["state"] in wanted else None

        return wait_for(check, timeout, f"edge worker {name} in {wanted}", interval=0.5)

    def edge_jobs(self, **filters) -> list[dict]:
        """Rows of the edge_job table (filters: dag_id_pattern, run_id_pattern, state, queue_pattern, worker_name_pattern)."""
        return self.get("/edge_worker/ui/jobs", **filters)["jobs"]

    def request_maintenance(self, name: str, comment: str = "astro-e2e maintenance") -> None:
        self.request("POST", f"/edge_worker/ui/worker/{name}/maintenance", json={"maintenance_comment": comment})

    def exit_maintenance(self, name: str) -> None:
        self.request("DELETE", f"/edge_worker/ui/worker/{name}/maintenance")

    def request_shutdown(self, name: str) -> None:
        self.request("POST", f"/edge_worker/ui/worker/{name}/shutdown")

    def set_worker_concurrency(self, name: str, concurrency: int) -> None:
        self.request("PATCH", f"/edge_worker/ui/worker/{name}/concurrency", json={"concurrency": concurrency})

    def add_worker_queue(self, name: str, queue: str) -> None:
        self.request("PUT", f"/edge_worker/ui/worker/{name}/queues/{queue}")

    def remove_worker_queue(self, name: str, queue: str) -> None:
        self.request("DELETE", f"/edge_worker/ui/worker/{name}/queues/{queue}")

    def delete_edge_worker(self, name: str) -> None:
        self.request("DELETE", f"/edge_worker/ui/worker/{name}")


def wait_counts(client: AirflowClient, queue: str, expected: dict[str, int], timeout: float = 60.0) -> dict[str, int]:
    """Poll ``counts_by_state(queue, expected.keys())`` until it equals ``expected``."""
    last: dict[str, int] = {}

    def check():
        nonlocal last
        last = client.counts_by_state(queue, expected.keys())
        return last == expected

    wait_for(check, timeout, f"counts on {queue} == {expected}", interval=0.5, on_timeout=lambda: f"last: {last}")
    return last
