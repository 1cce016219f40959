"""airflow DAG for the end-to-end tests: 10 tasks on queue qa, 30 s each (Prometheus queue-stats tests)."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_queue_a", tasks=10, queue="qa", seconds=30)
