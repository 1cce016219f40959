"""airflow DAG for the cluster stage's node-drain chaos scenario: 16 tasks of 40 s on queue
cluster-drain, so the workers on the drained Node are busy when they are evicted."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_drain", tasks=16, queue="cluster-drain", seconds=40)
