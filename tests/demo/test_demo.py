"""The README's demo command, in its short mode, end to end against a real Airflow 3.

Runs ``bash demo/run.sh --short`` exactly as a newcomer would (it builds what is missing,
unless ``ASTRO_AGENT_BIN`` / ``ASTRO_SENTINEL_BIN`` point at built binaries, as
tests/run.sh sets them) and checks its success line, its exit code and its summary:
every task succeeded, the pool went 0 -> max, down to one worker for the straggler, then to 0,
every worker drained and exited 0, and the Sentinel's scaling history (its page) saw the same
peaks as the live view.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_short_mode_ends_with_its_success_check(tmp_path):
    summary_file = tmp_path / "summary.json"
    proc = subprocess.run(
        ["bash", str(REPO / "demo" / "run.sh"), "--short", "--summary-json", str(summary_file)],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=1800,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "\nDEMO OK: 12/12 tasks succeeded" in proc.stdout

    s = json.loads(summary_file.read_text())
    assert s["ok"] is True and s["errors"] == []
    assert s["task_states"] == {"success": 12}
    assert s["run_state"] == "success"
    assert s["peak_workers"] == 3 and s["peak_wanted"] == 3
    # The page's numbers are the live view's: the Sentinel's history (Running from Airflow's
    # list of Edge workers, without Kubernetes) peaked where the pool did.
    assert s["page"]["peak_desired"] == 3 and s["page"]["peak_running"] == 3, s["page"]
    assert s["page"]["missing"] == ["workers", "waiting"], s["page"]
    # 0 -> 1 (activation) -> 3, then down while the straggler still runs, to 1, then to 0
    steps = s["replica_steps"]
    assert steps[:3] == [0, 1, 3] and steps[-2:] == [1, 0], steps
    assert steps[2:] == sorted(steps[2:], reverse=True), steps
    # every worker it started was stopped by the scaler's SIGTERM and drained cleanly
    assert len(s["exits"]) == s["workers_started"] >= 3
    assert all(e["code"] == 0 and e["how"] == "drain" for e in s["exits"]), s["exits"]
    # the live view showed the scaling decisions as they happened
    for event in ("scaler: activation: backlog 12 > 0 at 0 workers -> 1",
                  "scaler: scale up: ceil(",
                  "scaler: scale down: highest wanted over the last 5s",
                  "scaler: cooldown: backlog 0 for 5s -> 0 workers"):
        assert event in proc.stdout, event
