"""End-to-end tests against a real Apache Airflow 3.3.2 + Edge provider 5.1.0 on PostgreSQL.

How to run (from the repository root):

    V=$(tests/lib/venvs.sh tools) && "$V/bin/python" -m pytest tests/e2e -x -v

``tests/lib/venvs.sh`` is the one place that says which requirement files make up
the ``tools`` venv (pytest runs in it) and the ``airflow`` venv (only used to run
the Airflow daemons, the Python edge worker and task processes; test code never
imports airflow). Both are cached under ``${ASTRO_CACHE_DIR:-$HOME/.cache/astro-agent}``.

Fixtures:
* ``airflow`` (session): an :class:`harness.airflow_stack.AirflowStack` that is up — started
  once per session, stopped at the end (also on failure or Ctrl-C). Addresses,
  secrets and worker environments are attributes/methods of it; ``airflow.client``
  is a logged-in :class:`harness.airflow_client.AirflowClient`.
  It returns ``session_airflow``, on which ``own_airflow`` builds, so that a module can
  override ``airflow`` with ``own_airflow``.
* ``own_airflow`` (session): a stack no other test uses while this one runs, for tests that
  stop Airflow's daemons or its database, or fill its tables (see "Side by side" below). A
  module overrides ``airflow`` with it so that ``trigger_dag`` and ``python_edge_worker``
  use it too.
* ``trigger_dag``: ``trigger_dag(dag_id) -> run_id`` waits for the DAG to be parsed,
  unpauses it and starts a run with a unique run id. Runs this test started that
  are still unfinished when it ends are abandoned (:meth:`AirflowStack.abandon_run`:
  run set to ``failed``, its queued edge jobs deleted), so they do not leak into the
  next test's counts or hand a later worker stale jobs.
* ``astro_agent``: ``astro_agent(name, queues=[...], sync_slots=N, ...)`` starts a real
  astro-agent and waits until it is ready; every agent started is drained (then stopped) when
  the test ends.
* ``python_edge_worker``: ``python_edge_worker(name=..., queues=[...], concurrency=N)``
  starts the real Python ``airflow edge worker``; every worker started is stopped
  when the test ends.

Side by side (pytest-xdist, ``-n N`` as tests/run.sh runs this stage): the
controlling pytest process starts the one stack before its first worker starts, hands every
worker the stack's coordinates and secrets through xdist's worker input (never the
environment: test_secrets searches the agents' environments for the JWT secret), and stops it
by PID after the last worker has finished; the workers attach to it
(:meth:`AirflowStack.attach`). Without xdist (``pytest tests/e2e/test_x.py``) the session
starts its own stack as before. What tests share, and how they keep out of each other's way:

* a queue: the tests on one queue run one after another in one worker, as one group of
  :data:`GROUPS` (the scheduler that :func:`pytest_xdist_make_scheduler` gives xdist hands out
  whole groups); a module whose module-scoped fixtures start processes for several tests is
  one group too, so that it starts them once;
* worker names, ports and temp folders are per test (names are unique across the stage);
* a test that stops the api-server or PostgreSQL (test_sentinel), or fills task_instance with
  10 000 queued rows that take every pool slot (test_sentinel_cost), gets ``own_airflow``:
  under xdist a second stack of its own, started when the first such test needs it and
  stopped after the last (they are one group); without xdist, the session's stack as before.

Environment: ``ASTRO_E2E_KEEP=1`` keeps the stack's temp folder (daemon logs,
task logs) after the session.

Tests should be independent: trigger their own runs, use a queue only they
serve, and not rely on what earlier tests left behind.
"""

from __future__ import annotations

import pytest

from harness.airflow_client import AirflowClient
from harness.airflow_stack import AirflowStack
from harness.astro_agent_process import AstroAgent
from harness.python_edge_worker import PythonEdgeWorker
from harness.xdist_units import unit_scheduler

#: xdist worker-input key of the shared stack's :meth:`AirflowStack.state`.
STACK_STATE = "astro_e2e_airflow_stack"


#: The xdist work units: the tests of one group run one after another in one worker, and the
#: groups are handed out in this order (the longest first); every other test is a unit of its
#: own. A test is named by its file, or by its file and function. A new test on one of these
#: queues (or that must not share the stack) belongs in its group.
GROUPS: dict[str, tuple[str, ...]] = {
    # Queue `default`: e2e_short_40 and agents serving all of the queue; Airflow's counts of
    # the whole queue (test_stack); executor callbacks, which the Edge executor queues there.
    "queue-default": ("test_agent.py::test_two_agents_run_40_tasks_within_their_slots_and_ship_logs",
                      "test_agent.py::test_a_launcher_killed_mid_run_loses_no_task",
                      "test_stack.py::test_queue_counts_then_python_worker_runs_everything",
                      "test_callbacks.py"),
    # own_airflow: one second stack for all of them.
    "own-airflow": ("test_sentinel.py", "test_sentinel_cost.py"),
    # Queue `sentinel`: exact counts of e2e_queued_30 / e2e_slots_mix; test_ui's Sentinel starts once.
    "queue-sentinel": ("test_sentinel_slots.py", "test_ui.py"),
    # The module-scoped scenario (Prometheus, agents, runs on qa/qb) starts once.
    "prometheus": ("test_prometheus.py",),
    # Queue `long` (e2e_long_8), one agent at a time.
    "queue-long": ("test_agent.py::test_sigterm_drains_running_tasks_and_reports_offline",
                   "test_agent.py::test_queue_stats_equal_airflows_counts"),
    # Queue `canary`: the task searches the agent the test started, the only one serving it.
    "queue-canary": ("test_secrets.py",),
    # Queue `mapped` (e2e_mapped_4), one agent at a time.
    "queue-mapped": ("test_agent.py::test_a_launcher_that_cannot_start_falls_back_to_fresh_interpreters",
                     "test_agent.py::test_airflow_admin_actions_reach_the_agent"),
    # The module-scoped TLS PostgreSQL and https api-server start once.
    "tls": ("test_tls.py",),
    # Queue `compat` (e2e_compat_mix), one agent at a time.
    "queue-compat": ("test_compat_mix.py",),
    # Queue `sentinel-held`: each source's Sentinel counts every run held on the queue.
    "queue-sentinel-held": ("test_sentinel_held.py",),
    # Queue `sentinel-pause`: each source's Sentinel sees every Edge worker serving the queue
    # (the other's maintenance or concurrency would be its pool's too).
    "queue-sentinel-pause": ("test_sentinel_pause_and_slots.py",),
}


def group_of(nodeid: str) -> str | None:
    """The group of ``tests/e2e/test_x.py::test_y[param]`` in :data:`GROUPS`, if any."""
    path, _, rest = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1]
    function = rest.split("[", 1)[0]
    for group, members in GROUPS.items():
        if module in members or f"{module}::{function}" in members:
            return group
    return None


def pytest_collection_modifyitems(config, items):
    """A name in :data:`GROUPS` that names no test of a collected file (a renamed test) would
    let its test run beside the others on its queue: refuse to run."""
    # Looked up in the modules themselves: a run of chosen tests (the compatibility matrix)
    # collects only some of a module's tests.
    modules = {item.path.name: item.module for item in items}
    for members in GROUPS.values():
        for member in members:
            module, _, function = member.partition("::")
            if function and module in modules and not callable(getattr(modules[module], function, None)):
                raise pytest.UsageError(f"conftest GROUPS names {member}, which is no test")


# ---- running side by side (xdist) ---------------------------------------------------------


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whatever ``--dist`` says: the work units are :data:`GROUPS` (xdist's own ``loadgroup``
    marks do not take with this pytest), handed out in that order."""
    rank = {group: i for i, group in enumerate(GROUPS)}
    return unit_scheduler(config, log, lambda nodeid: group_of(nodeid) or nodeid,
                          lambda unit: rank.get(unit, len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist, in the controlling process, before each worker starts: hand it the shared stack
    (started on the first call)."""
    config = node.config
    if not hasattr(config, "_astro_e2e_stack"):
        config._astro_e2e_stack = _start_shared_stack(config)
    stack = config._astro_e2e_stack
    node.workerinput[STACK_STATE] = stack if isinstance(stack, dict) else stack.state()


def _start_shared_stack(config) -> AirflowStack | dict:
    """Starts the stack; returns it, or ``{"error": ...}`` for the workers to fail with."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    stack = AirflowStack()
    config.add_cleanup(stack.stop)  # after the workers are gone
    try:
        stack.start()
    except Exception as e:  # start() has stopped whatever it had started
        return {"error": f"the shared Airflow stack did not start: {type(e).__name__}: {e}"}
    if terminal is not None:
        terminal.write_line(f"shared {_up_line(stack)}")
    return stack


def _up_line(stack: AirflowStack) -> str:
    return (f"Airflow stack up in {stack.timings['total']:.1f}s: "
            + ", ".join(f"{k} {v:.1f}s" for k, v in stack.timings.items() if k != "total")
            + f"; {stack.api_base}; workdir {stack.workdir}")


@pytest.fixture(scope="session")
def session_airflow(request):
    """The running Airflow stack: the one the xdist controller started, or (without xdist)
    one for this session. Tests ask for ``airflow``, which a module may override."""
    state = getattr(request.config, "workerinput", {}).get(STACK_STATE)
    if state is not None:
        if "error" in state:
            raise RuntimeError(state["error"])
        yield AirflowStack.attach(state)
        return
    stack = AirflowStack()
    try:
        stack.start()
        print("\n" + _up_line(stack))
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def airflow(session_airflow):
    """The running Airflow stack (one per pytest session, or shared by the xdist workers)."""
    return session_airflow


@pytest.fixture(scope="session")
def own_airflow(session_airflow):
    """A stack no other test uses meanwhile: the session's when it is this process's own (no
    xdist), else a second one, started here and stopped after the last test that uses it
    (:func:`pytest_runtest_teardown`), or at the session's end."""
    if not session_airflow.attached:
        yield session_airflow
        return
    stack = AirflowStack()
    _own_stacks.append(stack)
    try:
        stack.start()
        print("\nown " + _up_line(stack))
        yield stack
    finally:
        stack.stop()


_own_stacks: list[AirflowStack] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop a second stack (``own_airflow``) as soon as the next test does not need it: it
    would take CPU from the other workers' tests for the rest of the session."""
    if _own_stacks and (nextitem is None or "own_airflow" not in nextitem.fixturenames):
        while _own_stacks:
            _own_stacks.pop().stop()


@pytest.fixture
def trigger_dag(airflow):
    """``trigger_dag(dag_id, run_id=None, conf=None) -> run_id``; cleans up unfinished runs."""
    client: AirflowClient = airflow.client
    started: list[tuple[str, str]] = []

    def trigger(dag_id: str, run_id: str | None = None, conf: dict | None = None) -> str:
        run = client.trigger(dag_id, run_id=run_id, conf=conf)
        started.append((dag_id, run))
        return run

    yield trigger

    for dag_id, run in started:
        try:
            airflow.abandon_run(dag_id, run)
        except Exception as e:  # the stack may be half-down after a failure
            print(f"could not clean up {dag_id}/{run}: {e}")


@pytest.fixture
def astro_agent(airflow):
    """``astro_agent(name, **kw)`` starts a ready agent; each is stopped at test end
    (a drain, then a second SIGTERM so no task outlives the test)."""
    agents: list[AstroAgent] = []

    def start(name: str, **kwargs) -> AstroAgent:
        agent = AstroAgent(airflow, name, **kwargs)
        agents.append(agent)
        return agent.start()

    yield start

    for agent in agents:
        agent.drain_then_stop()


@pytest.fixture
def python_edge_worker(airflow):
    """Factory for real Python edge workers; all are stopped (SIGINT drain) at test end."""
    workers: list[PythonEdgeWorker] = []

    def start(**kwargs) -> PythonEdgeWorker:
        worker = PythonEdgeWorker(airflow, **kwargs)
        workers.append(worker)
        return worker.start()

    yield start

    for worker in workers:
        worker.stop()
