"""airflow DAG for the cluster stage's KEDA scenario: a burst on queue cluster-burst (served only by
the `burst` worker Deployment). 16 tasks of 15 s, then 8 of 30 s that the Edge executor hands out
last (lowest priority): the pool is still busy while its backlog falls, so scale-down deletes
pods that are running tasks, which must drain."""
from astro_e2e_tasks import e2e_dag, sleeper

with e2e_dag("cluster_burst", queue="cluster-burst", max_active_tasks=24):
    for i in range(16):
        sleeper.override(task_id=f"short{i:02d}")(15)
    for i in range(8):
        sleeper.override(task_id=f"long{i:02d}", priority_weight=0)(30)
