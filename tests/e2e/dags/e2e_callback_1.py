"""airflow DAG for the end-to-end tests: a deadline alert whose ``SyncCallback`` runs on an
Edge worker (Airflow 3.3 with edge3 5.x: executor callbacks).

The alert fires 1 s after the run is queued. The DAG's one task is on queue ``callback-hold``,
which nothing serves, so the run is still going then and the deadline is always missed; the
Edge executor queues the callback (``astro_e2e_tasks.callback_marker``) on ``[operators]
default_queue``, here ``default``. The callback stays small: the whole workload must fit
``edge_job.command`` (2 048 characters), or the scheduler fails to store it.

Airflow before 3.3 has no executor callbacks (the compatibility pairs load this folder too):
there this file defines no DAG.
"""
from datetime import timedelta

from airflow import __version__ as airflow_version

from astro_e2e_tasks import callback_marker, e2e_dag, sleeper

if tuple(int(part) for part in airflow_version.split(".")[:2]) >= (3, 3):
    from airflow.sdk import DeadlineAlert, DeadlineReference, SyncCallback

    alert = DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(seconds=1),
        callback=SyncCallback(callback_marker),
    )
    with e2e_dag("e2e_callback_1", queue="callback-hold", max_active_tasks=1, deadline=alert):
        sleeper.override(task_id="held")(0)
