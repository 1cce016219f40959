"""airflow DAG for the end-to-end tests: 4 tasks on queue sentinel-held (nothing serves it) in
pool e2e_one_slot (1 slot, which the test creates): Airflow queues one and holds the other three
as scheduled, however many workers the queue would get."""
from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("e2e_pool_held", queue="sentinel-held", max_active_tasks=4):
    for i in range(4):
        sleeper.override(task_id=f"held{i}", pool="e2e_one_slot")(5)
