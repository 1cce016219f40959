"""airflow DAG for the end-to-end tests: one mapped task ("mapped") on queue default
with map_index 0..3, 1 s each — jobs whose map_index is not -1."""
from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("e2e_mapped_4", queue="default", max_active_tasks=4):
    sleeper.override(task_id="mapped").expand(seconds=[1, 1, 1, 1])
