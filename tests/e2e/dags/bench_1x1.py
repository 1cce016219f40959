"""airflow DAG for the end-to-end tests: benchmark: 1 task on queue bench, 1 s (trigger -> first start trials)."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("bench_1x1", tasks=1, queue="bench", seconds=1)
