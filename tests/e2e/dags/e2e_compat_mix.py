"""airflow DAG for the end-to-end tests and the compatibility matrix: one of each kind of task
instance a worker meets, on queue compat — "ok" succeeds, "fails" fails (no retry), "retried"
fails its first try and succeeds on its second, "mapped" has map_index 0..2, "two_slots" holds
two pool slots. The run ends failed (because of "fails")."""
from datetime import timedelta

from astro_e2e_tasks import e2e_dag, failer, fails_on_first_try, sleeper

with e2e_dag("e2e_compat_mix", queue="compat", max_active_tasks=8):
    sleeper.override(task_id="ok")(seconds=1)
    failer.override(task_id="fails")()
    fails_on_first_try.override(task_id="retried", retries=1, retry_delay=timedelta(seconds=1))()
    sleeper.override(task_id="mapped").expand(seconds=[1, 1, 1])
    sleeper.override(task_id="two_slots", pool_slots=2)(seconds=1)
