"""airflow DAG for the end-to-end tests: 30 tasks on queue sentinel (nothing serves it unless a test does), 1 s each."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_queued_30", tasks=30, queue="sentinel", seconds=1)
