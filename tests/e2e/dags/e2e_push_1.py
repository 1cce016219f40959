"""airflow DAG for the KEDA external-push tests: one task on queue push (nothing serves it, so it stays queued)."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("e2e_push_1", tasks=1, queue="push", seconds=1)
