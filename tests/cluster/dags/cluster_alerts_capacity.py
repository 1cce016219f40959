"""airflow DAG for the cluster stage's pool-alerts scenario: 18 tasks of 10 s on queue
cluster-alerts-big, whose workers request more CPU than the nodes have room for at the pool's maximum.
Two pods of 3 slots run them in three waves, so tasks stay queued for about 20 s while the pool is
at its maximum."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_alerts_capacity", tasks=18, queue="cluster-alerts-big", seconds=10)
