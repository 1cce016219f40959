"""airflow DAG for the cluster stage's Sentinel chaos scenario: 30 tasks of 20 s on queue
cluster-chaos-sentinel, five waves on a pool of 3 workers x 2 slots: work keeps waiting while the
Sentinel is deleted and, later, SIGKILLed."""
from astro_e2e_tasks import sleeper_dag

sleeper_dag("cluster_chaos_sentinel", tasks=30, queue="cluster-chaos-sentinel", seconds=20)
