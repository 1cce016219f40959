"""airflow DAG for the end-to-end tests: 7 tasks on queue sentinel (nothing serves it unless a
test does), 4 with pool_slots=1 and 3 with pool_slots=3: 13 task slots. 15 s each, so that a
worker with 13 slots runs them all at once long enough to be seen."""
from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("e2e_slots_mix", queue="sentinel", max_active_tasks=7):
    for i in range(4):
        sleeper.override(task_id=f"one{i}", pool_slots=1)(15)
    for i in range(3):
        sleeper.override(task_id=f"three{i}", pool_slots=3)(15)
