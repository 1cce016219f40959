"""airflow DAG for the wake-up tests: one short task on queue wake (only the test's agent serves it)."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_wake_1", tasks=1, queue="wake", seconds=0.1)
