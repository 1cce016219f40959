"""airflow DAG for the end-to-end tests: 8 tasks on queue default, 20 s each."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_long_8", tasks=8, queue="default", seconds=20)
