"""airflow DAG for the cluster stage's external-push scenario: one 5 s task on queue cluster-push."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_push", tasks=1, queue="cluster-push", seconds=5)
