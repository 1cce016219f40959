"""airflow DAG for the end-to-end tests: 1 short task on queue tls (an agent behind https)."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_tls_1", tasks=1, queue="tls", seconds=1)
