"""airflow DAG for the cluster stage's slow-Airflow chaos scenario: 4 tasks of 90 s on queue
cluster-slow-airflow, longer than a scaled-in worker's drain deadline."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_slow_airflow", tasks=4, queue="cluster-slow-airflow", seconds=90)
