"""airflow DAG for the end-to-end tests: one mapped task ("mapped") on queue mapped
with map_index 0..3, 1 s each — jobs whose map_index is not -1. A queue of its own, so that
its tests run beside those on queue default."""
from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("e2e_mapped_4", queue="mapped", max_active_tasks=4):
    sleeper.override(task_id="mapped").expand(seconds=[1, 1, 1, 1])
