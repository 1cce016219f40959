"""The test harness: real processes for the test stages, the demo and the benchmarks.

* ``procs``: :class:`~harness.procs.Daemon` (own process group, PID recorded, output in a log
  file), ``wait_for``, ``free_port``; every other module starts its processes through it.
* ``postgres``: a private, throw-away PostgreSQL cluster.
* ``airflow_stack``, ``airflow_client``: a real Airflow 3 + Edge executor on it, and its REST API.
* ``astro_agent_process``, ``python_edge_worker``: the two workers, against that stack.
* ``prometheus_server``: a real Prometheus and its promtool.
* ``certs``: a test PKI made with openssl.
* ``chromium``, ``sentinel_page``: the Sentinel's page in a real headless Chromium.

Only the package lives here; the tests that use it stay in their stage's folder.

``tests/lib`` is put on the import path, not installed: ``pythonpath`` in the repository's
``pytest.ini`` does it for every pytest stage, ``tests/lib/prologue.sh`` (``PYTHONPATH``) for the
demo and the benchmarks. The venvs are cached and shared by every clone and worktree of the
repository, so an (editable) install would tie them to the one clone that happened to build them.
This file imports nothing, so the modules that need only the standard library (``procs``,
``postgres``, ``prometheus_server``, ``certs``) import without the tools venv.
"""
