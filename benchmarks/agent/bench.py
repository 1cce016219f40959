"""Side-by-side benchmark: astro-agent against the Python ``airflow edge worker``.

Run it through ``benchmarks/agent/run.sh`` (builds the agent, finds the venvs). One real
Airflow 3 stack (tests/lib/harness/airflow_stack.py) serves both workers; each worker kind runs
in turn on queue ``bench`` (one worker at a time, queue empty between measurements):

1. worker RSS (``VmRSS`` of the worker's own PID, not its task processes): idle after
   registration, and while ``bench_16x60`` has 16 tasks running on a 16-slot worker;
2. idle CPU: utime+stime of the worker PID over an idle window, as % of one core, and the
   requests the idle worker makes of the api-server (the 16-slot worker talks to it through a
   counting proxy, counting_proxy.py);
3. trigger -> first task start of ``bench_32x3`` (Airflow's ``start_date``), on an idle,
   registered 4-slot worker;
4. refill gap on a saturated queue (``bench_32x3``, 32 x 3 s on 4 slots): the gap between a
   task ending and the next one starting on that worker, from the task instances'
   ``start_date``/``end_date``; and the makespan against the ideal 24 s.

Where a start's latency goes is split using the worker's own log (the moment it received
the job): ``end -> job received`` is the worker's report + fetch path, ``job received ->
start_date`` is starting the task process up to the task's ``run`` call to the Execution API.

Every process started here is stopped by PID on the way out, also on failure, Ctrl-C or
SIGTERM. Results go to stdout (a table) and to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from harness.airflow_stack import AirflowStack
from harness.astro_agent_process import AstroAgent
from harness.procs import wait_for
from harness.python_edge_worker import PythonEdgeWorker

from counting_proxy import CountingProxy
from wake_sentinel import REFRESH as SENTINEL_REFRESH, WakeSentinel

REPO = Path(__file__).resolve().parents[2]

QUEUE = "bench"
DAG_16 = "bench_16x60"
DAG_32 = "bench_32x3"
DAG_1 = "bench_1x1"
#: How long the agent's launcher keeps spares after the last burst of starts (DEMAND_WINDOW in
#: agent/python/astro_launcher.py), and some: the wait before "PSS idle after work".
SPARES_LET_GO_S = 190.0
TASK_SECONDS_32 = 3.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Worker kinds: the agent as deployed (default launch mode), the Python worker, and - on
#: request only - the agent starting every task in a fresh interpreter (--launch-mode fresh).
KINDS = ("astro-agent", "astro-agent-baseline", "python", "astro-agent-fresh", "astro-agent-wake")
DEFAULT_KINDS = ("astro-agent", "python")
#: ``--wake``: the agent subscribed to the Sentinel, the agent polling, the Python worker.
WAKE_KINDS = ("astro-agent-wake", "astro-agent", "python")
LABELS = {"astro-agent": "astro-agent", "python": "python edge worker", "astro-agent-fresh": "astro-agent (fresh)",
          "astro-agent-baseline": "astro-agent (baseline)", "astro-agent-wake": "astro-agent (wake-up)"}
SHORT = {"astro-agent": "agent", "python": "python", "astro-agent-fresh": "agent-fresh",
         "astro-agent-baseline": "agent-base", "astro-agent-wake": "agent-wake"}
#: Targets of the wake-up (issue 22): an idle warm worker's queued -> running, and the requests
#: of 20 idle agents against 20 idle Python workers.
TARGET_WAKE_P50_S = 0.5
TARGET_WAKE_P95_S = 1.0
TARGET_FLEET_RATIO = 0.25
FLEET_SIZE = 20
#: The baseline kind runs another build of the agent (an earlier commit's), to compare two
#: versions in one run.
BASELINE_BIN = "ASTRO_AGENT_BASELINE_BIN"
#: Task-instance states that mean the queue still has work in it.
ACTIVE_TI_STATES = ("scheduled", "queued", "running", "restarting", "up_for_retry", "deferred")

# Targets from the project brief.
TARGET_AGENT_RSS_IDLE_MIB = 15.0
TARGET_AGENT_IDLE_CPU_PCT = 0.05
TARGET_AGENT_REFILL_S = 0.5
TARGET_PYTHON_REFILL_S = 5.0
# The pre-forked launcher's targets (default launch mode only).
TARGET_AGENT_START_S = 0.3
TARGET_AGENT_PSS_PER_TASK_MIB = 100.0
TARGET_AGENT_MAKESPAN_S = 27.0
#: A new worker with a job waiting: process start -> the job's start_date.
TARGET_AGENT_COLD_START_S = 1.5


# ---- /proc readers ---------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name; index 0 is field 3 (state)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def cpu_ticks(pid: int) -> int:
    """utime + stime of the process (all its threads), in clock ticks."""
    f = _stat_fields(pid)
    return int(f[11]) + int(f[12])


def runtime_ns(pid: int) -> int:
    """Time on CPU of the process's current threads in ns (schedstat; finer than ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry.name))[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _try(fn, pid: int):
    """``fn(pid)``, or None when the process is gone."""
    try:
        return fn(pid)
    except (OSError, RuntimeError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + Path("/proc/loadavg").read_text().strip()


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def say(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def mib(kib: float | None) -> float | None:
    return None if kib is None else kib / 1024.0


# ---- timestamps -------------------------------------------------------------------------


def ts(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOG_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(Z|[+-]\d{2}:?\d{2})?")


def log_time(line: str) -> datetime | None:
    """The first timestamp in a log line (local time when it carries no zone)."""
    m = LOG_TIME.search(line[:80])
    if not m:
        return None
    stamp = m.group(1).replace(",", ".").replace(" ", "T")
    if "." in stamp:  # fromisoformat takes at most 6 fraction digits
        head, frac = stamp.split(".")
        stamp = f"{head}.{frac[:6]}"
    zone = m.group(2)
    if zone:
        return datetime.fromisoformat(stamp + ("+00:00" if zone == "Z" else zone))
    return datetime.fromisoformat(stamp).astimezone().astimezone(timezone.utc)


#: Worker log messages that mark a job's steps: (event, astro-agent text, Python worker text).
#: "received": the fetch returned the job. "ended": the worker saw the task process end
#: (astro-agent logs it before its last log push; the Python worker after it).
WORKER_EVENTS = (
    ("received", "job received", "Received job:"),
    ("ended", "task process ended", "Job completed:"),
    ("ended", "task process ended", "Job failed:"),
)


def worker_events(log_file: Path, dag_id: str, run_id: str) -> dict[str, dict[str, datetime]]:
    """event -> task_id -> when the worker logged it, for the jobs of ``run_id``.

    astro-agent's lines carry ``task=<dag>.<task> run=<run>``; the Python worker's
    ``dag_id=<dag> task_id=<task> run_id=<run>``.
    """
    out: dict[str, dict[str, datetime]] = {event: {} for event, _, _ in WORKER_EVENTS}
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return out
    agent = re.compile(rf"task={re.escape(dag_id)}\.(\S+) run={re.escape(run_id)}(?:\s|$)")
    python = re.compile(rf"dag_id={re.escape(dag_id)} task_id=(\S+) run_id={re.escape(run_id)}(?:\s|$)")
    for raw in text.splitlines():
        line = ANSI.sub("", raw)
        for event, agent_text, python_text in WORKER_EVENTS:
            if agent_text in line or python_text in line:
                m = agent.search(line) or python.search(line)
                when = log_time(line)
                if m and when:
                    out[event].setdefault(m.group(1), when)
                break
    return out


def marker_times(log_folder: Path, dag_id: str, run_id: str) -> dict[str, datetime]:
    """task_id -> when the task's own code began (its marker line in the task log, which the
    task process writes as JSON lines under the worker's log folder)."""
    out: dict[str, datetime] = {}
    base = log_folder / f"dag_id={dag_id}" / f"run_id={run_id}"
    for path in base.glob("task_id=*/attempt=1.log"):
        task_id = path.parent.name.split("=", 1)[1]
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if "astro-e2e marker" not in line:
                continue
            try:
                when = ts(json.loads(line).get("timestamp"))
            except (ValueError, AttributeError):
                when = log_time(line)
            if when:
                out[task_id] = when
                break
    return out


#: The log line that says astro-agent's registration was accepted (the Python worker logs none).
REGISTERED_TEXTS = ("registered with Airflow",)
#: Where a new worker's cold start went (``Bench.cold_starts``).
COLD_START_PARTS = ("start_to_first_start_s", "start_to_registered_s", "start_to_received_s",
                    "received_to_first_start_s")


def first_logged(log_file: Path, texts: tuple[str, ...], after: datetime) -> datetime | None:
    """When the worker first logged a line containing one of ``texts``, at or after ``after``."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for raw in lines:
        line = ANSI.sub("", raw)
        if any(t in line for t in texts):
            when = log_time(line)
            if when and when >= after:
                return when
    return None


def seconds_between(a: datetime | None, b: datetime | None) -> float | None:
    return (b - a).total_seconds() if a and b else None


#: Where a run's first start went, as analyse_run splits it.
FIRST_START_PARTS = ("trigger_to_first_start_s", "trigger_to_first_queued_s", "queued_to_first_start_s",
                     "first_received_to_start_s")


def first_start_summaries(runs: list[dict]) -> dict:
    """Each part of the first start, summarised over the runs that have it."""
    return {key: summary([r[key] for r in runs if r[key] is not None]) for key in FIRST_START_PARTS}


def summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


# ---- workers ----------------------------------------------------------------------------


class Worker:
    """One worker process of either kind, with a uniform start/stop."""

    def __init__(self, stack: AirflowStack, kind: str, name: str, slots: int, api_base: str | None = None,
                 sentinel: WakeSentinel | None = None, launch_mode: str | None = None):
        """``api_base``: where the worker reaches the Edge API (the counting proxy), when not the
        api-server itself; ``sentinel``: what an ``astro-agent-wake`` subscribes to;
        ``launch_mode``: the agent's, when not its kind's."""
        self.stack, self.kind, self.name, self.slots = stack, kind, name, slots
        if kind.startswith("astro-agent"):
            # The agent's defaults (30 s heartbeat, 5 s idle fetch) - the same cadence as the
            # Python worker; the harness's 2 s test heartbeat would inflate idle CPU.
            mode = {}
            if kind == "astro-agent-fresh":
                if "launch_mode" in inspect.signature(AstroAgent).parameters:
                    mode = {"launch_mode": "fresh"}
                else:
                    mode = {"extra_args": ["--launch-mode", "fresh"]}
            if kind == "astro-agent-baseline":
                mode["program"] = Path(os.environ[BASELINE_BIN])
            if kind == "astro-agent-wake":
                # The agent's defaults otherwise: 60 s between idle fetches while subscribed.
                mode["extra_args"] = ["--sentinel-url", sentinel.url, "--sentinel-token-file", str(sentinel.token_file)]
            if launch_mode:
                mode["launch_mode"] = launch_mode
            self.impl = AstroAgent(
                stack, name, queues=[QUEUE], sync_slots=slots, queue_stats=False, heartbeat_interval="30s",
                api_base=api_base, **mode
            )
            # The same task environment as the Python worker gets from the harness: without
            # this, every task (Airflow's default load_examples=True) loads the example DAG
            # bundles and example plugins, seconds per task on a busy machine.
            self.impl.daemon.env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        else:
            self.impl = PythonEdgeWorker(stack, name=name, queues=[QUEUE], concurrency=slots, api_base=api_base)

    @property
    def pid(self) -> int:
        return self.impl.daemon.pid

    @property
    def log_file(self) -> Path:
        return self.impl.daemon.log_file

    @property
    def task_log_folder(self) -> Path:
        return self.stack.worker_log_folder(self.name)

    def alive(self) -> bool:
        return self.impl.daemon is not None and self.impl.daemon.alive()

    def launch(self) -> None:
        """Start the process and return at once (no wait for its registration)."""
        if self.kind.startswith("astro-agent"):
            self.impl.daemon.start()
        else:
            self.impl.start(wait=False)

    def start(self) -> "Worker":
        self.impl.start()
        # Registered: Airflow shows it idle (its first heartbeat after registration).
        self.stack.client.wait_edge_worker(self.name, states=("idle",), timeout=120)
        return self

    def stop(self, urgent: bool = False) -> int | None:
        """Stop the worker; a drain normally, forcing running tasks down when ``urgent``."""
        daemon = self.impl.daemon
        if daemon is None or daemon.proc is None:
            return None
        if self.kind.startswith("astro-agent"):
            if daemon.alive():
                daemon.send_signal(signal.SIGTERM)  # the agent's drain
                try:
                    daemon.wait(3 if urgent else 60)
                except subprocess.TimeoutExpired:
                    daemon.send_signal(signal.SIGTERM)  # second SIGTERM: stop the tasks
            return daemon.stop(timeout=60)
        # SIGINT is the Python worker's drain; its SIGTERM fails the running tasks.
        return daemon.stop(sig=signal.SIGTERM if urgent else signal.SIGINT, timeout=30 if urgent else 120)


# ---- the benchmark ----------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        self.stack: AirflowStack | None = None
        self.proxy: CountingProxy | None = None
        self.workers: list[Worker] = []
        self.runs: list[tuple[str, str]] = []
        self.rng = random.Random(args.seed)
        self.uptimes: list[dict] = []
        self.sentinel: WakeSentinel | None = None

    @property
    def client(self):
        return self.stack.client

    def note_load(self, phase: str) -> None:
        line = uptime()
        self.uptimes.append({"phase": phase, "at": datetime.now(timezone.utc).isoformat(), "uptime": line})
        say(f"uptime ({phase}): {line}")

    # -- hygiene --

    def trigger(self, dag_id: str) -> tuple[str, datetime]:
        at = datetime.now(timezone.utc)
        run = self.client.trigger(dag_id)
        self.runs.append((dag_id, run))
        return run, at

    def queue_empty(self, timeout: float = 180.0) -> None:
        """Abandon our unfinished runs and wait until queue ``bench`` has no work at all."""
        for dag_id, run in self.runs:
            self.stack.abandon_run(dag_id, run)

        def empty():
            tis = self.client.count(QUEUE, ACTIVE_TI_STATES)
            jobs = self.stack.sql(
                f"SELECT count(*) FROM edge_job WHERE queue = '{QUEUE}' "
                "AND state IN ('queued', 'running', 'restarting', 'scheduled')"
            ).strip()
            return tis == 0 and jobs == "0"

        wait_for(empty, timeout, f"queue {QUEUE} to be empty", interval=0.5)

    def start_worker(self, kind: str, slots: int, counted: bool = False) -> Worker:
        """A registered, idle worker; with ``counted``, reaching the api-server through the proxy."""
        self.queue_empty()
        name = f"bench-{SHORT[kind]}-{slots}"
        worker = Worker(self.stack, kind, name, slots, api_base=self.proxy.url if counted else None,
                        sentinel=self.sentinel)
        self.workers.append(worker)
        say(f"starting {LABELS[kind]} {name} with {slots} slots")
        t = time.monotonic()
        worker.start()
        worker.start_to_idle_s = time.monotonic() - t
        say(f"{name} registered and idle after {worker.start_to_idle_s:.1f}s (pid {worker.pid})")
        return worker

    def stop_worker(self, worker: Worker) -> None:
        code = worker.stop()
        say(f"stopped {worker.name} (exit {code})")

    # -- measurements --

    def idle(self, worker: Worker) -> dict:
        """Settle, then sample RSS every second over the idle window and take CPU time across it."""
        time.sleep(self.args.settle)
        self.note_load(f"{worker.name} idle")
        pid, seconds = worker.pid, self.args.idle_seconds
        # Helper processes of an idle worker (astro-agent's pre-forked Python launcher): no
        # tasks run now, so every descendant is part of the worker's own footprint.
        helpers = descendants(pid)
        helper_cmds = {p: _cmdline(p) for p in helpers}
        rss: list[int] = []
        tree_pss: list[int] = []
        t0, ticks0, ns0 = time.monotonic(), cpu_ticks(pid), runtime_ns(pid)
        helper_ticks0 = {p: _try(cpu_ticks, p) for p in helpers}
        requests0 = self.proxy.counts()
        next_sample = t0
        while True:
            worker.impl.daemon.check_alive()
            rss.append(rss_kib(pid))
            # PSS: the launcher's waiting spares share most pages with it; RSS would count
            # those pages once per process.
            tree_pss.append(pss_kib(pid) + sum(_try(pss_kib, p) or 0 for p in helpers))
            next_sample += 1.0
            if next_sample - t0 > seconds:
                break
            time.sleep(max(0.0, next_sample - time.monotonic()))
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        t1, ticks1, ns1 = time.monotonic(), cpu_ticks(pid), runtime_ns(pid)
        requests = self.proxy.counts() - requests0
        helper_ticks = sum(
            (_try(cpu_ticks, p) or 0) - (t or 0) for p, t in helper_ticks0.items() if t is not None
        )
        elapsed = t1 - t0
        result = {
            "helpers": [{"pid": p, "cmd": c} for p, c in helper_cmds.items()],
            "tree_pss_mib_max": mib(max(tree_pss)),
            "tree_cpu_pct": 100.0 * (ticks1 - ticks0 + helper_ticks) / CLK_TCK / elapsed,
            "seconds": elapsed,
            "rss_kib_samples": rss,
            "rss_mib_max": mib(max(rss)),
            "rss_mib_last": mib(rss[-1]),
            "cpu_ticks": ticks1 - ticks0,
            "clk_tck": CLK_TCK,
            "cpu_pct": 100.0 * (ticks1 - ticks0) / CLK_TCK / elapsed,
            "cpu_pct_schedstat": 100.0 * (ns1 - ns0) / 1e9 / elapsed,
            "loadavg": loadavg(),
            "api_requests": dict(requests),
            "api_requests_per_min": 60.0 * sum(requests.values()) / elapsed,
        }
        say(
            f"{worker.name} idle {elapsed:.0f}s: {sum(requests.values())} api-server requests {dict(requests)}; RSS max {result['rss_mib_max']:.1f} MiB, "
            f"CPU {result['cpu_pct']:.3f}% ({ticks1 - ticks0} ticks), schedstat {result['cpu_pct_schedstat']:.4f}%; "
            f"with {len(helpers)} helper process(es): PSS {result['tree_pss_mib_max']:.1f} MiB, "
            f"CPU {result['tree_cpu_pct']:.3f}%"
        )
        return result

    def running16(self, worker: Worker) -> dict:
        """RSS of the worker PID while bench_16x60 has 16 tasks running on it."""
        run, _ = self.trigger(DAG_16)
        say(f"triggered {DAG_16} run {run}; waiting for 16 running tasks on {worker.name}")
        samples: list[dict] = []
        full_since: float | None = None
        deadline = time.monotonic() + 300
        self_pid = worker.pid
        loaded = False
        while time.monotonic() < deadline:
            worker.impl.daemon.check_alive()
            tis = self.client.task_instances(DAG_16, run)
            n = sum(1 for t in tis if t["state"] == "running" and t["hostname"] == worker.name)
            tree = descendants(self_pid)
            sample = {
                "t": time.monotonic(),
                "running": n,
                "rss_kib": rss_kib(self_pid),
                "tree_pss_kib": pss_kib(self_pid) + sum(pss_kib(p) for p in tree),
                "processes": 1 + len(tree),
            }
            samples.append(sample)
            if n >= 16 and full_since is None:
                full_since = sample["t"]
                self.note_load(f"{worker.name} 16 running")
            if full_since is not None and sample["t"] - full_since >= self.args.busy_seconds:
                loaded = True
                break
            if all(t["state"] in ("success", "failed", "skipped", "upstream_failed") for t in tis):
                break
            time.sleep(0.5)
        full = [s for s in samples if s["running"] >= 16]
        peak = max((s["running"] for s in samples), default=0)
        at_peak = [s for s in samples if s["running"] == peak] or samples
        result = {
            "run_id": run,
            "reached_16": bool(full),
            "sampled_full_window": loaded,
            "peak_running": peak,
            "rss_mib_max": mib(max(s["rss_kib"] for s in at_peak)) if at_peak else None,
            "rss_mib_median": mib(statistics.median(s["rss_kib"] for s in at_peak)) if at_peak else None,
            "tree_pss_mib_max": mib(max(s["tree_pss_kib"] for s in at_peak)) if at_peak else None,
            # Everything the worker needs per running task: its whole tree over the task count.
            "tree_pss_per_task_mib": mib(max(s["tree_pss_kib"] for s in at_peak) / peak) if at_peak and peak else None,
            "processes_max": max((s["processes"] for s in at_peak), default=0),
            "samples_at_peak": len(at_peak),
            "samples": samples,
            "loadavg": loadavg(),
        }
        say(
            f"{worker.name}: peak {peak} running; worker RSS max {result['rss_mib_max']:.1f} MiB, "
            f"worker+tasks PSS {result['tree_pss_mib_max']:.0f} MiB over {len(at_peak)} samples"
        )
        state = self.client.wait_run(DAG_16, run, timeout=600)
        result["run_state"] = state
        say(f"{DAG_16} run finished: {state}")
        return result

    def refill(self, worker: Worker) -> dict:
        """bench_32x3 on an idle 4-slot worker, ``reps`` times."""
        reps = []
        for i in range(self.args.reps):
            self.queue_empty()
            # Trigger at a random point of the worker's idle fetch cycle (5 s).
            time.sleep(self.args.settle + self.rng.uniform(0.0, 5.0))
            self.note_load(f"{worker.name} {DAG_32} #{i + 1}")
            run, triggered = self.trigger(DAG_32)
            state = self.client.wait_run(DAG_32, run, timeout=900)
            tis = self.client.task_instances(DAG_32, run)
            events = worker_events(worker.log_file, DAG_32, run)
            markers = marker_times(worker.task_log_folder, DAG_32, run)
            rep = analyse_run(tis, triggered, worker, events, markers)
            rep.update(run_id=run, run_state=state, loadavg=loadavg())
            reps.append(rep)
            say(
                f"{DAG_32} #{i + 1} ({state}): trigger->first start {rep['trigger_to_first_start_s']:.2f}s, "
                f"refill gap mean {rep['refill_gap_s']['mean']:.2f}s max {rep['refill_gap_s']['max']:.2f}s, "
                f"makespan {rep['makespan_s']:.1f}s"
            )
        gaps = [g for r in reps for g in r["refill_gaps"]]

        def pooled(part):
            return summary([g for r in reps for g in r["refill_split"][part]])

        return {
            "reps": reps,
            **first_start_summaries(reps),
            "refill_gap_s": summary(gaps),
            "refill_end_to_exit_s": pooled("end_to_exit"),
            "refill_exit_to_received_s": pooled("exit_to_received"),
            "refill_received_to_start_s": pooled("received_to_start"),
            "start_to_task_code_s": summary([d for r in reps for d in r["start_to_task_code"]]),
            "start_latency_first_wave_s": summary([d for r in reps for d in r["start_latency_first_wave"]]),
            "start_latency_s": summary([d for r in reps for d in r["start_latency"]]),
            "makespan_s": summary([r["makespan_s"] for r in reps]),
            "task_duration_s": summary([d for r in reps for d in r["task_durations"]]),
            "all_success": all(r["all_success"] for r in reps),
        }

    def trigger_trials(self, worker: Worker) -> dict:
        """Trigger -> first task start on the idle worker, ``trials`` times, each triggered at a
        random point of its 5 s idle fetch cycle; then, after the launcher's demand window, the
        worker's PSS once it has let its spares go."""
        trials = []
        for i in range(self.args.trials):
            self.queue_empty()
            time.sleep(1.0 + self.rng.uniform(0.0, 5.0))
            run, triggered = self.trigger(DAG_1)
            state = self.client.wait_run(DAG_1, run, timeout=300)
            tis = self.client.task_instances(DAG_1, run)
            rep = analyse_run(tis, triggered, worker, worker_events(worker.log_file, DAG_1, run), {})
            trials.append({k: rep[k] for k in (*FIRST_START_PARTS, "all_success")} | {"run_id": run, "run_state": state})
        first = summary([t["trigger_to_first_start_s"] for t in trials])
        say(f"{worker.name}: {first['n']} trials, trigger->first start mean {first['mean']:.2f}s, "
            f"median {first['median']:.2f}s ({first['min']:.2f}-{first['max']:.2f})")
        self.queue_empty()
        pss = []
        if not self.args.quick and not self.args.wake:  # three minutes of waiting
            time.sleep(SPARES_LET_GO_S)
            self.note_load(f"{worker.name} idle after work")
            for _ in range(5):
                pss.append(pss_kib(worker.pid) + sum(_try(pss_kib, p) or 0 for p in descendants(worker.pid)))
                time.sleep(1.0)

        return {
            "trials": trials,
            **first_start_summaries(trials),
            "all_success": all(t["all_success"] for t in trials),
            "tree_pss_mib_idle_after_work": mib(max(pss)) if pss else None,
        }

    def cold_starts(self, kind: str) -> dict:
        """A new worker's own cold start, ``cold_starts`` times: one ``bench_1x1`` job waits on
        the queue (the Edge executor has queued it) before the worker process starts, as when
        an autoscaler adds a worker because work is queued; process start -> the task's
        ``start_date``, split by the worker's log at registration and at the job's arrival."""
        samples = []
        for _ in range(self.args.cold_starts):
            self.queue_empty()
            run, _ = self.trigger(DAG_1)
            wait_for(lambda: self.edge_jobs_waiting() == 1, 120, f"the {DAG_1} job to wait on queue {QUEUE}",
                     interval=0.2)
            worker = Worker(self.stack, kind, f"bench-{SHORT[kind]}-cold", 4)
            self.workers.append(worker)
            started = datetime.now(timezone.utc)
            worker.launch()
            try:
                state = self.client.wait_run(DAG_1, run, timeout=300)
            finally:
                self.stop_worker(worker)
            (ti,) = self.client.task_instances(DAG_1, run)
            first_start = ts(ti.get("start_date"))
            received = worker_events(worker.log_file, DAG_1, run)["received"].get(ti["task_id"])
            registered = first_logged(worker.log_file, REGISTERED_TEXTS, started)
            samples.append({
                "run_id": run,
                "run_state": state,
                "start_to_first_start_s": seconds_between(started, first_start),
                "start_to_registered_s": seconds_between(started, registered),
                "start_to_received_s": seconds_between(started, received),
                "received_to_first_start_s": seconds_between(received, first_start),
            })
            say(f"{worker.name}: process start -> first task start_date "
                f"{fmt(samples[-1]['start_to_first_start_s'], ' s')}")
        return {
            "samples": samples,
            **{k: summary([s[k] for s in samples if s[k] is not None]) for k in COLD_START_PARTS},
            "all_success": all(s["run_state"] == "success" for s in samples),
        }

    def edge_jobs_waiting(self) -> int:
        return int(self.stack.sql(f"SELECT count(*) FROM edge_job WHERE queue = '{QUEUE}' AND state = 'queued'"))
    def idle_fleet(self, kind: str) -> dict:
        """api-server requests per idle minute of FLEET_SIZE idle workers of ``kind``, all
        reaching the Edge API through the counting proxy (the count is taken there: the
        api-server logs no access lines by default, which is why counting from its log read 0).
        The agents start tasks in fresh interpreters: a fleet of pre-forked launchers would only
        load the machine, and an idle worker's requests do not depend on it."""
        self.queue_empty()
        fleet = []
        try:
            for i in range(FLEET_SIZE):
                name = f"fleet-{SHORT[kind]}-{i:02d}"
                worker = Worker(self.stack, kind, name, 4, api_base=self.proxy.url, sentinel=self.sentinel,
                                launch_mode="fresh" if kind.startswith("astro-agent") else None)
                self.workers.append(worker)
                fleet.append(worker)
                worker.impl.start()
            for worker in fleet:
                self.stack.client.wait_edge_worker(worker.name, states=("idle",), timeout=300)
            say(f"{FLEET_SIZE} idle {LABELS[kind]} workers registered")
            time.sleep(self.args.settle)
            if kind == "astro-agent-wake":
                subscribed = sum(w.impl.gauge("astro_agent_sentinel_subscribed") == 1 for w in fleet)
                say(f"{subscribed} of {FLEET_SIZE} subscribed to the Sentinel")
            self.note_load(f"{FLEET_SIZE} idle {SHORT[kind]}")
            before, t0 = self.proxy.counts(), time.monotonic()
            time.sleep(self.args.idle_seconds)
            requests, elapsed = self.proxy.counts() - before, time.monotonic() - t0
        finally:
            for worker in fleet:
                worker.stop(urgent=True)
        per_min = 60.0 * sum(requests.values()) / elapsed
        say(f"{FLEET_SIZE} idle {LABELS[kind]}: {per_min:.1f} api-server requests per minute {dict(requests)}")
        return {"workers": FLEET_SIZE, "seconds": elapsed, "api_requests": dict(requests), "api_requests_per_min": per_min}

    def bench_wake(self, kind: str, out: dict) -> None:
        """Queued -> running on an idle warm 4-slot worker (the trials), then the idle fleet."""
        out["kind"] = kind
        if self.args.trials == 0:  # the idle fleet alone
            out["fleet"] = self.idle_fleet(kind)
            return
        worker = self.start_worker(kind, 4)
        try:
            # Warm: a first task has run, so the launcher and its spares are ready.
            run, _ = self.trigger(DAG_1)
            self.client.wait_run(DAG_1, run, timeout=300)
            out["trials"] = self.trigger_trials(worker)
            if kind == "astro-agent-wake":
                out["wakeups"] = worker.impl.gauge("astro_agent_wakeups_total")
        except BaseException:
            worker.stop(urgent=True)
            raise
        self.stop_worker(worker)
        out["fleet"] = self.idle_fleet(kind)

    # -- one worker kind --

    def bench_kind(self, kind: str, out: dict) -> None:
        """Measure one worker kind; results land in ``out`` as they come (kept on failure)."""
        out["kind"] = kind
        if self.args.cold_starts:
            out["cold"] = self.cold_starts(kind)
        if self.args.cold_starts_only:
            return
        worker = self.start_worker(kind, 16, counted=True)
        out["start_to_idle_s"] = [worker.start_to_idle_s]
        try:
            out["idle"] = self.idle(worker)
            out["busy16"] = self.running16(worker)
        except BaseException:
            worker.stop(urgent=True)
            raise
        self.stop_worker(worker)
        worker = self.start_worker(kind, 4)
        out["start_to_idle_s"].append(worker.start_to_idle_s)
        out["start_idle"] = summary(out["start_to_idle_s"])
        try:
            out["refill"] = self.refill(worker)
            if self.args.trials:
                out["trials"] = self.trigger_trials(worker)
        except BaseException:
            worker.stop(urgent=True)
            raise
        self.stop_worker(worker)
        self.queue_empty()


def analyse_run(
    tis: list[dict],
    triggered: datetime,
    worker: Worker,
    events: dict[str, dict[str, datetime]],
    markers: dict[str, datetime],
) -> dict:
    slots = worker.slots
    received, ended = events["received"], events["ended"]
    done = [t for t in tis if t.get("start_date") and t.get("end_date")]
    starts = sorted(ts(t["start_date"]) for t in done)
    queued = [ts(t.get("queued_when")) for t in tis if t.get("queued_when")]
    by_start = sorted(done, key=lambda t: ts(t["start_date"]))
    by_end = sorted(done, key=lambda t: ts(t["end_date"]))
    # A slot freed by the k-th end is refilled by the (slots+k)-th start; all 32 tasks are
    # queued from the start, so every refill happens while tasks are still queued.
    # Split of each gap, pairing the k-th of each sorted sequence (the k-th freed slot is the
    # k-th refilled one, whichever task it was): end_date -> the worker saw the task process
    # end (Airflow's supervisor finishing after its final state call) -> the worker received
    # the next job (its last log push, state report and fetch) -> start_date (launching the
    # task up to its supervisor's `run` call to the Execution API). The parts sum to the gap.
    ends = [ts(t["end_date"]) for t in by_end]
    starts_refill = starts[slots:]
    exits = sorted(ended[t["task_id"]] for t in done if t["task_id"] in ended)
    receipts = sorted(received[t["task_id"]] for t in done if t["task_id"] in received)[slots:]
    gaps = [(s - e).total_seconds() for s, e in zip(starts_refill, ends)]
    end_to_exit, exit_to_received, received_to_start = [], [], []
    if len(exits) >= len(starts_refill) and len(receipts) == len(starts_refill):
        for e, x, r, s in zip(ends, exits, receipts, starts_refill):
            end_to_exit.append((x - e).total_seconds())
            exit_to_received.append((r - x).total_seconds())
            received_to_start.append((s - r).total_seconds())
    start_to_code = [
        (markers[t["task_id"]] - ts(t["start_date"])).total_seconds() for t in done if t["task_id"] in markers
    ]
    first = by_start[0] if by_start else None
    first_got = received.get(first["task_id"]) if first else None
    # Start latency: job received -> start_date (the supervisor's `run` call), for the first
    # wave (as many tasks as slots, all received at once) and for every task.
    start_latency = [
        (ts(t["start_date"]) - received[t["task_id"]]).total_seconds() for t in by_start if t["task_id"] in received
    ]
    first_wave = [
        (ts(t["start_date"]) - received[t["task_id"]]).total_seconds()
        for t in by_start[:slots] if t["task_id"] in received
    ]
    return {
        "tasks": len(tis),
        "all_success": len(tis) > 0 and all(t["state"] == "success" for t in tis),
        "hosts": sorted({str(t.get("hostname")) for t in tis}),
        "on_this_worker": all(t.get("hostname") == worker.name for t in tis),
        "triggered_at": triggered.isoformat(),
        "trigger_to_first_start_s": (starts[0] - triggered).total_seconds() if starts else math.nan,
        "trigger_to_first_queued_s": (min(queued) - triggered).total_seconds() if queued else None,
        "queued_to_first_start_s": (starts[0] - min(queued)).total_seconds() if queued and starts else None,
        "first_received_to_start_s": (starts[0] - first_got).total_seconds() if first_got and starts else None,
        "refill_gaps": gaps,
        "refill_gap_s": summary(gaps) or {"mean": math.nan, "max": math.nan},
        "refill_split": {
            "end_to_exit": end_to_exit,
            "exit_to_received": exit_to_received,
            "received_to_start": received_to_start,
        },
        "start_to_task_code": start_to_code,
        "start_latency": start_latency,
        "start_latency_first_wave": first_wave,
        "jobs_received_logged": len(received),
        "jobs_ended_logged": len(ended),
        "task_markers_found": len(markers),
        "makespan_s": (ts(by_end[-1]["end_date"]) - starts[0]).total_seconds() if starts else math.nan,
        "ideal_makespan_s": math.ceil(len(tis) / slots) * TASK_SECONDS_32,
        "task_durations": [(ts(t["end_date"]) - ts(t["start_date"])).total_seconds() for t in done],
        "task_instances": [
            {
                "task_id": t["task_id"],
                "state": t["state"],
                "hostname": t.get("hostname"),
                "queued_when": t.get("queued_when"),
                "job_received": received[t["task_id"]].isoformat() if t["task_id"] in received else None,
                "start_date": t.get("start_date"),
                "task_code": markers[t["task_id"]].isoformat() if t["task_id"] in markers else None,
                "end_date": t.get("end_date"),
                "process_ended": ended[t["task_id"]].isoformat() if t["task_id"] in ended else None,
            }
            for t in by_start
        ],
    }


# ---- report -----------------------------------------------------------------------------


def _get(d: dict | None, *path):
    for p in path:
        if not isinstance(d, dict) or d.get(p) is None:
            return None
        d = d[p]
    return d


def fmt(value, unit: str = "", digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}{unit}"


def verdict(value, limit: float, who: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{who}: n/a"
    if value <= limit:
        return f"{who}: met"
    return f"{who}: MISSED by {value - limit:.3g} ({value / limit:.1f}x)"


def table(results: dict, kinds: list[str]) -> tuple[list[list[str]], str]:
    """The report table: one column per worker kind (astro-agent, python edge worker, ...)."""
    cols = [k for k in KINDS if k in kinds] or list(DEFAULT_KINDS)
    targets = {  # metric key -> {kind: limit}
        "rss": {k: TARGET_AGENT_RSS_IDLE_MIB for k in cols if k.startswith("astro-agent")},
        "cpu": {k: TARGET_AGENT_IDLE_CPU_PCT for k in cols if k.startswith("astro-agent")},
        "refill": {k: (TARGET_PYTHON_REFILL_S if k == "python" else TARGET_AGENT_REFILL_S) for k in cols},
        "start": {k: TARGET_AGENT_START_S for k in cols if k == "astro-agent"},
        "pss": {k: TARGET_AGENT_PSS_PER_TASK_MIB for k in cols if k == "astro-agent"},
        "makespan": {k: TARGET_AGENT_MAKESPAN_S for k in cols if k == "astro-agent"},
        "cold": {k: TARGET_AGENT_COLD_START_S for k in cols if k == "astro-agent"},
    }
    refill_target = f"agent <= {TARGET_AGENT_REFILL_S:g} s; python <= {TARGET_PYTHON_REFILL_S:g} s"

    def row(metric, path, unit="", digits=2, target="", check=None):
        values = [_get(results.get(k), *path) for k in cols]
        verdicts = [verdict(v, targets[check][k], SHORT[k]) for k, v in zip(cols, values) if check and k in targets[check]]
        return [metric, *(fmt(v, unit, digits) for v in values), target, "; ".join(verdicts)]

    def ranged(metric, path, target="", check=None):
        r = row(metric, path + ("mean",), "s", 2, target, check)
        for i, k in enumerate(cols, start=1):
            lo, hi, n = (_get(results.get(k), *path, f) for f in ("min", "max", "n"))
            if lo is not None and n and n > 1:
                r[i] += f" ({lo:.2f}-{hi:.2f}, n={n})"
        return r

    rows = [
        row("RSS idle, worker PID (max over idle window)", ("idle", "rss_mib_max"), " MiB", 1,
            f"agent <= {TARGET_AGENT_RSS_IDLE_MIB:g} MiB", "rss"),
        row("  (info) PSS idle, worker PID + helper processes", ("idle", "tree_pss_mib_max"), " MiB", 1, "-"),
        row("RSS with 16 tasks running, worker PID only", ("busy16", "rss_mib_max"), " MiB", 1, "-"),
        row("  (info) PSS worker + all task processes, 16 running", ("busy16", "tree_pss_mib_max"), " MiB", 0, "-"),
        row("PSS per running task (that total / 16)", ("busy16", "tree_pss_per_task_mib"), " MiB", 1,
            f"agent <= {TARGET_AGENT_PSS_PER_TASK_MIB:g} MiB", "pss"),
        row("Idle CPU, worker PID utime+stime (% of one core)", ("idle", "cpu_pct"), " %", 3,
            f"agent <= {TARGET_AGENT_IDLE_CPU_PCT:g} %", "cpu"),
        row("  (info) idle CPU, worker PID, schedstat ns", ("idle", "cpu_pct_schedstat"), " %", 4, "-"),
        row("  (info) idle CPU, worker PID + helper processes", ("idle", "tree_cpu_pct"), " %", 3, "-"),
        row("api-server requests per idle minute (fetch + heartbeat)", ("idle", "api_requests_per_min"), "", 1,
            "agent <= python"),
        ranged("Process start -> registered and idle in Airflow", ("start_idle",), "agent <= 1 s"),
        row("  (info) PSS idle after work, worker + helpers (spares let go)",
            ("trials", "tree_pss_mib_idle_after_work"), " MiB", 1, "-"),
        ranged("Trigger -> first task start_date, 1-task DAG, random phase", ("trials", "trigger_to_first_start_s"),
               "agent <= python"),
        ranged("  of which trigger -> TI queued (scheduler)", ("trials", "trigger_to_first_queued_s")),
        ranged("  of which TI queued -> start_date (worker)", ("trials", "queued_to_first_start_s")),
        ranged("New worker, job waiting: process start -> first task start_date", ("cold", "start_to_first_start_s"),
               f"agent <= {TARGET_AGENT_COLD_START_S:g} s and < python", "cold"),
        ranged("  of which process start -> registered", ("cold", "start_to_registered_s")),
        ranged("  of which process start -> job received", ("cold", "start_to_received_s")),
        ranged("  of which job received -> start_date", ("cold", "received_to_first_start_s")),
        ranged("Trigger -> first task start_date (32-task DAG)", ("refill", "trigger_to_first_start_s"), "-"),
        ranged("  of which trigger -> TIs queued (scheduler)", ("refill", "trigger_to_first_queued_s")),
        ranged("  of which first job received -> its start_date", ("refill", "first_received_to_start_s")),
        row("Start latency, job received -> start_date, median of the first 4 (received at once)",
            ("refill", "start_latency_first_wave_s", "median"), " s", 2, f"agent <= {TARGET_AGENT_START_S:g} s", "start"),
        row("  (info) start latency, median of all 32", ("refill", "start_latency_s", "median"), " s", 2, "-"),
        ranged("Refill gap, mean (32 x 3 s tasks, 4 slots)", ("refill", "refill_gap_s"), refill_target, "refill"),
        row("Refill gap, max", ("refill", "refill_gap_s", "max"), " s", 2, refill_target, "refill"),
        ranged("  refill: end_date -> worker sees task process end", ("refill", "refill_end_to_exit_s")),
        ranged("  refill: process end -> next job received", ("refill", "refill_exit_to_received_s")),
        ranged("  refill: job received -> start_date", ("refill", "refill_received_to_start_s")),
        ranged("Makespan 32 x 3 s on 4 slots (first start -> last end)", ("refill", "makespan_s"),
               f"ideal {8 * TASK_SECONDS_32:g} s; agent <= {TARGET_AGENT_MAKESPAN_S:g} s", "makespan"),
        ranged("  (info) task start_date -> end_date (3 s sleep)", ("refill", "task_duration_s")),
        ranged("  (info) task start_date -> task code runs", ("refill", "start_to_task_code_s")),
    ]
    header = ["metric", *(LABELS[k] for k in cols), "target", "verdict"]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return [header] + rows, "\n".join(lines)


# ---- main -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between the sorted values."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def wake_table(results: dict, kinds: list[str]) -> tuple[list[list[str]], str]:
    """The wake-up figures: queued -> running (p50, p95, mean, n) per kind, and the idle fleets'
    requests per minute, with the targets for the agent with the wake-up."""
    rows = [["metric", *(LABELS[k] for k in kinds), "target"]]
    python_rate = _get(results.get("python"), "fleet", "api_requests_per_min")
    for label, q in (("queued -> running p50 (s)", 0.5), ("queued -> running p95 (s)", 0.95)):
        row = [label]
        for k in kinds:
            trials = _get(results.get(k), "trials", "trials") or []
            values = [t["queued_to_first_start_s"] for t in trials if t.get("queued_to_first_start_s") is not None]
            row.append(f"{percentile(values, q):.2f}" if values else "-")
        limit = TARGET_WAKE_P50_S if q == 0.5 else TARGET_WAKE_P95_S
        wake = row[1 + kinds.index("astro-agent-wake")] if "astro-agent-wake" in kinds else "-"
        row.append(f"<= {limit} ({verdict(float(wake), limit, 'wake-up') if wake != '-' else '-'})")
        rows.append(row)
    rows.append(["queued -> running mean (s)", *(fmt(_get(results.get(k), "trials", "queued_to_first_start_s", "mean"))
                                                  for k in kinds), ""])
    rows.append(["trials", *(str(len(_get(results.get(k), "trials", "trials") or [])) for k in kinds), ">= 20"])
    rows.append([f"{FLEET_SIZE} idle workers: requests/min",
                 *(fmt(_get(results.get(k), "fleet", "api_requests_per_min"), digits=1) for k in kinds), ""])
    ratio_row = [f"  ratio to {FLEET_SIZE} python"]
    for k in kinds:
        rate = _get(results.get(k), "fleet", "api_requests_per_min")
        ratio_row.append(f"{rate / python_rate:.2f}" if rate is not None and python_rate else "-")
    wake_ratio = ratio_row[1 + kinds.index("astro-agent-wake")] if "astro-agent-wake" in kinds else "-"
    ratio_row.append(f"<= {TARGET_FLEET_RATIO} ({verdict(float(wake_ratio), TARGET_FLEET_RATIO, 'wake-up') if wake_ratio != '-' else '-'})")
    rows.append(ratio_row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
    return rows, text


def versions(stack: AirflowStack | None) -> dict:
    out: dict = {}
    try:
        out["git_commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE, text=True
        ).stdout.strip()
        out["agent_sources_modified"] = bool(subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "agent", "airflow", "Cargo.lock"],
            stdout=subprocess.PIPE, text=True,
        ).stdout.strip())
    except OSError:
        pass
    if stack is not None and stack._venv is not None:
        code = ("import importlib.metadata as m, sys; print(m.version('apache-airflow'), "
                "m.version('apache-airflow-providers-edge3'), sys.version.split()[0])")
        r = subprocess.run([str(stack.python), "-c", code], stdout=subprocess.PIPE, text=True)
        if r.returncode == 0 and r.stdout.split():
            af, edge, py = r.stdout.split()
            out.update(airflow=af, edge_provider=edge, python=py)
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 s idle window, 1 repetition, short samples")
    ap.add_argument("--out", help="JSON results file (default: a new temp file)")
    ap.add_argument("--workers", default=",".join(DEFAULT_KINDS),
                    help=f"comma list of {', '.join(KINDS)} (default: {','.join(DEFAULT_KINDS)})")
    ap.add_argument("--idle-seconds", type=float, help="idle CPU/RSS window (default 60, quick 10)")
    ap.add_argument("--settle", type=float, help="seconds a registered worker idles before measuring (default 10, quick 3)")
    ap.add_argument("--busy-seconds", type=float, help="RSS sampling once 16 tasks run (default 10, quick 3)")
    ap.add_argument("--reps", type=int, help=f"{DAG_32} runs per worker (default 3, quick 1)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random trigger offsets")
    ap.add_argument("--wake", action="store_true",
                    help="the wake-up benchmark only: queued -> running trials and 20 idle workers' api-server "
                         f"requests for {', '.join(WAKE_KINDS)} (unless --workers says otherwise)")
    ap.add_argument("--trials", type=int, help=f"{DAG_1} trigger -> first start trials per worker (default 20, quick 3; 0 skips)")
    ap.add_argument("--cold-starts", type=int,
                    help="new-worker cold starts with a job waiting, per worker (default 5, quick 2; 0 skips)")
    ap.add_argument("--cold-starts-only", action="store_true", help="measure only the new-worker cold starts")
    args = ap.parse_args(argv)
    defaults = {"idle_seconds": (60.0, 10.0), "settle": (10.0, 3.0), "busy_seconds": (10.0, 3.0), "reps": (3, 1),
                "trials": (20, 3), "cold_starts": (5, 2)}
    for key, (full, quick) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if args.wake and args.workers == ",".join(DEFAULT_KINDS):
        args.workers = ",".join(WAKE_KINDS)
    args.kinds = [k.strip() for k in args.workers.split(",") if k.strip()]
    if "astro-agent-baseline" in args.kinds and not os.environ.get(BASELINE_BIN):
        ap.error(f"--workers astro-agent-baseline needs {BASELINE_BIN}: the path of the build to compare with")
    bad = [k for k in args.kinds if k not in KINDS]
    if bad:
        ap.error(f"unknown worker kind(s) {bad}; choose from {list(KINDS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.out:
        out_path = Path(args.out)
    else:
        fd, name = tempfile.mkstemp(prefix="astro-agent-bench-", suffix=".json")
        os.close(fd)
        out_path = Path(name)

    def _interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)

    bench = Bench(args)
    results: dict = {}
    error = None
    started = datetime.now(timezone.utc)
    say(f"mode {'quick' if args.quick else 'full'}: idle {args.idle_seconds:g}s, settle {args.settle:g}s, "
        f"{args.reps} x {DAG_32}; workers {', '.join(args.kinds)}; results -> {out_path}")
    bench.note_load("start")
    try:
        bench.stack = AirflowStack()
        bench.stack.start()
        say(f"Airflow up in {bench.stack.timings['total']:.1f}s at {bench.stack.api_base}")
        bench.proxy = CountingProxy(bench.stack.api_base).start()
        for dag in (DAG_16, DAG_32, DAG_1):
            bench.client.ensure_runnable(dag)
        if any(kind == "astro-agent-wake" for kind in args.kinds):
            bench.sentinel = WakeSentinel(bench.stack, bench.stack.workdir / "sentinel", [QUEUE]).start()
            say(f"Sentinel (postgres source, refresh {SENTINEL_REFRESH}) at {bench.sentinel.url}")
        for kind in args.kinds:
            if args.wake:
                bench.bench_wake(kind, results.setdefault(kind, {}))
            else:
                bench.bench_kind(kind, results.setdefault(kind, {}))
    except BaseException as e:  # report what we have, then re-raise after cleaning up
        error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        for worker in bench.workers:
            try:
                if worker.alive():
                    worker.stop(urgent=True)
            except Exception as e:
                print(f"could not stop {worker.name}: {e}", file=sys.stderr)
        if bench.stack is not None:
            for dag_id, run in bench.runs:
                try:
                    bench.stack.abandon_run(dag_id, run)
                except Exception:
                    pass
            meta = versions(bench.stack)
            if bench.sentinel is not None:
                bench.sentinel.stop()
            if bench.proxy is not None:
                bench.proxy.stop()
            bench.stack.stop()
        else:
            meta = versions(None)
    bench.note_load("end")

    rows, text = wake_table(results, args.kinds) if args.wake else table(results, args.kinds)
    print()
    print(f"astro-agent vs Python edge worker, one Airflow stack ({meta.get('airflow', '?')} + edge3 "
          f"{meta.get('edge_provider', '?')}, Python {meta.get('python', '?')}), commit {meta.get('git_commit', '?')}"
          + (" (agent sources modified)" if meta.get("agent_sources_modified") else ""))
    print(f"mode {'quick' if args.quick else 'full'}; {os.cpu_count()} CPUs; load during the run:")
    for u in bench.uptimes:
        print(f"  {u['phase']:<32} {u['uptime']}")
    print()
    print(text)
    print()
    doc = {
        "started_at": started.isoformat(),
        "mode": "quick" if args.quick else "full",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "cpus": os.cpu_count(),
        "versions": meta,
        "uptime": bench.uptimes,
        "stack_timings": bench.stack.timings if bench.stack else {},
        "targets": {
            "agent_rss_idle_mib": TARGET_AGENT_RSS_IDLE_MIB,
            "agent_idle_cpu_pct": TARGET_AGENT_IDLE_CPU_PCT,
            "agent_refill_gap_s": TARGET_AGENT_REFILL_S,
            "python_refill_gap_s": TARGET_PYTHON_REFILL_S,
        },
        "results": results,
        "table": rows,
        "error": error,
    }
    out_path.write_text(json.dumps(doc, indent=2, default=str))
    print(f"results written to {out_path}")
    if error:
        print(f"benchmark FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
