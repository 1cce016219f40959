"""airflow DAG for the cluster stage's alerts-at-zero scenario: two 5 s tasks on queue cluster-at-zero."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_at_zero", tasks=2, queue="cluster-at-zero", seconds=5)
