"""The drain rule, checked on the pods a scenario saw deleted: each one's agent exited 0 inside its
grace period, after every task it was running when its deletion was requested had ended."""

from __future__ import annotations

from datetime import datetime

from infra.kube import PodStory


def _end(ti: dict) -> float:
    return datetime.fromisoformat(ti["end_date"].replace("Z", "+00:00")).timestamp()


def assert_drained(deleted: list[PodStory], tis: list[dict], grace_seconds: int) -> list[tuple[str, list[str], float]]:
    """Asserts the rule for every story of ``deleted`` against the run's task instances ``tis``
    (Airflow knows a task's worker by pod name). Returns, for the pods that were running tasks
    when their deletion was requested: (pod, those tasks, seconds from the request to the exit)."""
    busy = []
    for story in deleted:
        assert story.exit_code == 0, f"{story.name}: the agent exited {story.exit_code} on deletion"
        assert story.grace_period == grace_seconds, (story.name, story.grace_period)
        assert story.finished_at is not None, f"{story.name}: no exit seen"
        assert story.deletion_requested_at is not None, f"{story.name}: no deletion seen"
        drain = story.finished_at.timestamp() - story.deletion_requested_at
        assert drain < grace_seconds, f"{story.name} took {drain:.1f}s to stop"
        running = [t for t in tis if t["hostname"] == story.name and _end(t) > story.deletion_requested_at]
        for t in running:
            assert _end(t) <= story.finished_at.timestamp() + 1, f"{story.name} exited before its task {t['task_id']} ended"
        if running:
            busy.append((story.name, [t["task_id"] for t in running], round(drain, 1)))
    return busy
