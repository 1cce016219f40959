"""airflow DAG for the cluster stage's HPA scale-up speed scenario: 16 tasks of 40 s on queue cluster-hpa-fast."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_hpa_fast", tasks=16, queue="cluster-hpa-fast", seconds=40)
