"""airflow DAG for the cluster stage's control-plane chaos scenarios: 36 tasks of 20 s on queue
cluster-outage, six waves on 3 workers x 2 slots, so work runs and waits through each outage and
its recovery."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_outage", tasks=36, queue="cluster-outage", seconds=20)
