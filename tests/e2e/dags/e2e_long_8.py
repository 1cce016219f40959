"""airflow DAG for the end-to-end tests: 8 tasks on queue long, 20 s each (a queue of its own, so
that its tests run beside those on queue default)."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_long_8", tasks=8, queue="long", seconds=20)
