"""airflow DAG for the cluster stage's pool-alerts scenario: 12 tasks of 10 s on queue
cluster-alerts-big, whose workers request more CPU than the nodes have room for at the pool's maximum."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_alerts_capacity", tasks=12, queue="cluster-alerts-big", seconds=10)
