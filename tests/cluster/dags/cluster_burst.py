"""airflow DAG for the cluster stage's KEDA scenario: a burst on queue cluster-burst (served only by
the `burst` worker Deployment). 16 tasks of 15 s, then 8 that the Edge executor hands out last
(lowest priority) and that end one by one, 30 s to 100 s: the backlog falls while the pool is
still busy, so scale-down deletes pods that are running tasks, which must drain (each ends
within 80 s of the first scale-down, inside the 90 s grace period)."""
from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("cluster_burst", queue="cluster-burst", max_active_tasks=24):
    for i in range(16):
        sleeper.override(task_id=f"short{i:02d}")(15)
    for i in range(8):
        sleeper.override(task_id=f"long{i:02d}", priority_weight=0)(30 + 10 * i)
