"""airflow DAG for the end-to-end tests: 4 tasks on queue default with pool_slots=2,
5 s each. The Edge executor copies pool_slots into the job's concurrency_slots, so
each of these jobs occupies two worker slots."""
from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("e2e_slots_2x4", queue="default", max_active_tasks=8):
    for i in range(4):
        sleeper.override(task_id=f"t{i:02d}", pool_slots=2)(5)
