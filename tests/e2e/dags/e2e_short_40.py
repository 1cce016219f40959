"""airflow DAG for the end-to-end tests: 40 tasks on queue default, 1 s each."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_short_40", tasks=40, queue="default", seconds=1)
