"""airflow DAG for the cluster stage's HPA scenario: 12 tasks of 20 s on queue cluster-hpa."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_hpa", tasks=12, queue="cluster-hpa", seconds=20)
