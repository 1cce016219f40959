"""airflow DAG for the end-to-end tests: one task on queue default printing the marker,
then 15000 filler lines (~1.6 MB of task log, more than one 512 KiB push chunk), then
"astro-e2e end of big log"."""
from astro_e2e_tasks import big_logger, e2e_dag

with e2e_dag("e2e_big_log", queue="default", max_active_tasks=1):
    big_logger.override(task_id="big")(15000)
