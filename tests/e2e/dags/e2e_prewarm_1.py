"""airflow DAG for the pre-warm test: one task on queue prewarm (nothing serves it, so it stays
queued), run every minute on the minute. CronTriggerTimetable without run_immediately: the first
run is the next minute, not one for a minute already past."""
from airflow.sdk import CronTriggerTimetable

from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("e2e_prewarm_1", "prewarm", 1, schedule=CronTriggerTimetable("* * * * *", timezone="UTC")):
    sleeper.override(task_id="t00")(1)
