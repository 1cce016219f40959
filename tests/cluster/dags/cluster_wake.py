"""airflow DAG for the cluster stage's identity scenario: one 5 s task on queue cluster-bound."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_wake", tasks=1, queue="cluster-bound", seconds=5)
