"""airflow DAG for the cluster stage's idle-first scale-in scenario: one 60 s task on queue
cluster-idle-first, so one of the pool's three workers is busy while the pool scales in."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_idle_first", tasks=1, queue="cluster-idle-first", seconds=60)
