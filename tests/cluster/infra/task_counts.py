"""The chaos scenarios' count: tasks submitted / succeeded / failed / lost, printed, and none
failed or lost."""

from __future__ import annotations


def assert_all_succeeded(tis: list[dict], submitted: int) -> None:
    succeeded = sum(t["state"] == "success" for t in tis)
    failed = sum(t["state"] in ("failed", "upstream_failed") for t in tis)
    print(f"tasks submitted {submitted}, succeeded {succeeded}, failed {failed}, lost {submitted - succeeded - failed}")
    assert (len(tis), succeeded, failed) == (submitted, submitted, 0), [(t["task_id"], t["state"]) for t in tis]
