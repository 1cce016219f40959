"""airflow DAG for the end-to-end tests: 10 tasks on queue qb, 30 s each (Prometheus queue-stats tests)."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_queue_b", tasks=10, queue="qb", seconds=30)
