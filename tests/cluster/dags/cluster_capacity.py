"""airflow DAG for the cluster stage's capacity scenario: 12 tasks of 10 s on queue cluster-big,
whose workers request more CPU than the nodes have room for at the pool's maximum."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_capacity", tasks=12, queue="cluster-big", seconds=10)
