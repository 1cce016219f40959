"""airflow DAG for the end-to-end tests: one task on queue default that prints the
marker and raises, so the run ends failed (no retries)."""
from astro_e2e_tasks import e2e_dag, failer

with e2e_dag("e2e_fail_1", queue="default", max_active_tasks=1):
    failer.override(task_id="fail")()
