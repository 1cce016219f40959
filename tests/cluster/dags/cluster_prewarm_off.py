"""airflow DAG for the cluster stage's pre-warm scenario (pool with pre-warm off): one 1 s task on
queue cluster-prewarm-off, every 40 s from when it is unpaused (DeltaTriggerTimetable; without
catchup the first run is at once)."""
from datetime import timedelta

from airflow.sdk import DeltaTriggerTimetable

from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("cluster_prewarm_off", "cluster-prewarm-off", 1, schedule=DeltaTriggerTimetable(timedelta(seconds=40))):
    sleeper.override(task_id="t00")(1)
