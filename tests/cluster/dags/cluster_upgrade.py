"""airflow DAG for the cluster stage's upgrade chaos scenario: 18 tasks of 40 s on queue
cluster-upgrade, so the workers are busy while `helm upgrade` rolls them."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_upgrade", tasks=18, queue="cluster-upgrade", seconds=40)
