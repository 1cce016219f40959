"""airflow DAG for the end-to-end tests: benchmark: 32 tasks on queue bench, 3 s each."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("bench_32x3", tasks=32, queue="bench", seconds=3)
