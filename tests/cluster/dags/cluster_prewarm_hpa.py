"""airflow DAG for the cluster stage's HPA pre-warm scenario: three 2 s tasks on queue
cluster-hpa-prewarm, every 100 s from when it is unpaused (DeltaTriggerTimetable; without catchup
the first run is at once, and it teaches the Sentinel the run's demand)."""
from datetime import timedelta

from airflow.sdk import DeltaTriggerTimetable

from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("cluster_prewarm_hpa", "cluster-hpa-prewarm", 3, schedule=DeltaTriggerTimetable(timedelta(seconds=100))):
    for i in range(3):
        sleeper.override(task_id=f"t{i:02d}")(2)
