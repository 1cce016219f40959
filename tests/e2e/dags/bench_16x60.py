"""airflow DAG for the end-to-end tests: benchmark: 16 tasks on queue bench, 60 s each."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("bench_16x60", tasks=16, queue="bench", seconds=60)
