"""The Sentinel's page at ``/ui/`` in a real headless Chromium, against a real astro-sentinel
that reads the real Airflow this session's fixtures start (source ``airflow-api``).

* Without a token the page says how to get one; a wrong token is said to be refused.
* With the token (typed, then Enter): the worker list with each pool's range and its Current
  workers bar; a worker's Scaling history opened from the keyboard (Tab to its button, Enter),
  the range changed with the arrow keys, labels and focus checked, Escape closes it and gives
  the focus back.
* The history's lines, tiles and findings against the Sentinel's own answer: skipped only
  while ``GET /v1/workers/{name}/history`` answers 404.
* The page's drawing of a history shaped like the API contract, with the Kubernetes-based
  series (Workers, Waiting for capacity) that this Kubernetes-less Sentinel never records:
  only the history answers are replaced, inside the browser; the Sentinel is untouched.

Screenshots go to a folder under the test's temp folder (printed); with
``ASTRO_UI_SCREENSHOT=/some/file.png`` the Scaling history screenshot is also copied there, and
the worker list next to it as ``file-workers.png``.

Browser: Debian's ``chromium`` and ``chromium-driver`` (see :mod:`harness.chromium`).
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.select import Select

from harness.chromium import Chromium
from harness.procs import wait_for
from harness.sentinel_page import by_id, card, enter_token, loaded_range, opened, save, until
from harness.sentinel_page import sign_in as sign_in_with
# The Sentinel as test_sentinel.py runs it: same binary fixture, config, token and workers.
from test_sentinel import DAG, QUEUE, SHARED, TASKS, TOKEN, WORKER, Sentinel, sentinel_bin  # noqa: F401

TOKEN_KEY = "astro-sentinel-token"
COLD_START_PHASES = ["backlogSeen", "replicasRaised", "podScheduled", "containerStarted",
                     "agentRegistered", "firstTaskRunning"]
RANGES = ["Last 15 minutes", "Last 1 hour", "Last 6 hours", "Last 1 day", "Last 7 days", "Last 14 days"]
RANGE_VALUES = ["15m", "1h", "6h", "1d", "7d", "14d"]
# The ranges a young recording opens on, by their length; older recordings open on 1 day.
OPENING_RANGES = [("15m", timedelta(minutes=15)), ("1h", timedelta(hours=1)), ("6h", timedelta(hours=6))]
DURATION_TABLE = Path(__file__).resolve().parents[2] / "sentinel" / "tests" / "data" / "duration_text.json"


# ---- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel(airflow, sentinel_bin, tmp_path_factory):
    """One Sentinel for the module, reading Airflow's REST API; stopped by PID at the end."""
    s = Sentinel(sentinel_bin, tmp_path_factory.mktemp("ui-sentinel"),
                 {"type": "airflow-api", "airflowApi": {"url": airflow.api_base}},
                 {"ASTRO_SENTINEL_AIRFLOW_USERNAME": "admin", "ASTRO_SENTINEL_AIRFLOW_PASSWORD": "admin"})
    try:
        s.start()
        wait_for(lambda: s.backlog() is not None, 60, "the sentinel's first backlog",
                 on_timeout=lambda: f"{s.worker()}\n{s.daemon.tail()}")
        yield s
    finally:
        s.stop()


@pytest.fixture
def browser(tmp_path):
    chromium = Chromium(tmp_path / "chromium")
    try:
        chromium.start()
        yield chromium
    finally:
        console = chromium.console()
        chromium.stop()
        print("browser console:\n  " + "\n  ".join(console))


@pytest.fixture
def screenshots(tmp_path, capsys) -> Path:
    folder = tmp_path / "screenshots"
    folder.mkdir()
    with capsys.disabled():  # shown in every run, not only with a failure
        print(f"\nscreenshots: {folder}")
    return folder


def page_url(sentinel: Sentinel) -> str:
    return f"http://127.0.0.1:{sentinel.port}/ui/"


# ---- page helpers -------------------------------------------------------------------------


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def opening_range(recording_age: timedelta) -> str:
    """The range the page opens on for a recording this old: the shortest that holds it."""
    return next((r for r, length in OPENING_RANGES if recording_age <= length), "1d")


def label_of(driver, control: WebElement) -> str:
    return driver.execute_script("return arguments[0].labels[0].textContent.trim()", control)


def sign_in(driver, sentinel: Sentinel) -> None:
    sign_in_with(driver, page_url(sentinel), TOKEN)


def tab_to(driver, accessible_name: str, limit: int = 30) -> WebElement:
    """Presses Tab until the control named ``accessible_name`` has the focus."""
    seen = []
    for _ in range(limit):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        active = driver.switch_to.active_element
        name = active.get_attribute("aria-label") or active.text
        if name == accessible_name:
            return active
        seen.append(f"{active.tag_name}:{name!r}")
    raise AssertionError(f"{accessible_name!r} not reached with {limit} Tabs; focus went to {seen}")


def focus_ring(driver, element: WebElement) -> tuple[str, float]:
    style, width = driver.execute_script(
        "const s = getComputedStyle(arguments[0]); return [s.outlineStyle, parseFloat(s.outlineWidth)]", element)
    return style, width


def publish(history_png: Path, workers_png: Path) -> None:
    """Copies the screenshots to ``$ASTRO_UI_SCREENSHOT`` (and its ``-workers`` sibling)."""
    target = os.environ.get("ASTRO_UI_SCREENSHOT")
    if not target:
        return
    target_path = Path(target)
    target_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(history_png, target_path)
    shutil.copyfile(workers_png, target_path.with_name(f"{target_path.stem}-workers{target_path.suffix or '.png'}"))
    print(f"copied the screenshots to {target_path} and its -workers sibling")


# ---- without a usable token ---------------------------------------------------------------


def test_without_a_token_the_page_says_how_to_get_one(sentinel, browser):
    d = browser.driver
    d.get(page_url(sentinel))
    until(d, lambda d: by_id(d, "token-panel").is_displayed(), "ask for a token")
    assert "needs a bearer token" in by_id(d, "token-problem").text
    help_text = by_id(d, "token-help").text
    # A person's own token first; nobody is sent to read KEDA's Secret.
    assert "kubectl create token <your service account> -n <its namespace>" in help_text
    assert "sentinel.kubernetes.userAccess" in help_text and "auth.staticTokensFile" in help_text
    assert "kubectl get secret" not in help_text
    field = by_id(d, "token-input")
    assert label_of(d, field) == "Bearer token"
    assert field.get_attribute("type") == "password"
    assert d.switch_to.active_element == field, "the focus is not in the token field"
    assert not by_id(d, "workers").is_displayed()
    assert WORKER not in d.page_source, "worker data reached a page without a token"


def test_a_wrong_token_is_refused(sentinel, browser):
    d = browser.driver
    d.get(page_url(sentinel))
    enter_token(d, "not-the-token")
    until(d, lambda d: "refused" in by_id(d, "token-problem").text, "say the token was refused")
    problem = by_id(d, "token-problem").text
    assert "401" in problem and "invalid bearer token" in problem, problem
    assert by_id(d, "token-panel").is_displayed() and not by_id(d, "workers").is_displayed()
    assert d.execute_script(f"return sessionStorage.getItem('{TOKEN_KEY}')") is None, "a refused token was kept"
    assert WORKER not in d.page_source


# ---- the worker list and the Scaling history dialog ----------------------------------------


def test_worker_list_and_scaling_history_by_keyboard(sentinel, browser, screenshots, trigger_dag):
    # Thirty tasks queued on the workers' queue with nothing to run them: a real backlog.
    trigger_dag(DAG)
    wait_for(lambda: sentinel.backlog() == TASKS, 120, f"the sentinel's backlog {TASKS}")
    d = browser.driver
    sign_in(d, sentinel)

    # The list: every worker, with its queue, range and Current workers bar.
    until(d, lambda d: "Wanted now: 8 workers" in card(d, WORKER).text, "show the backlog of 30")
    main, shared = card(d, WORKER), card(d, SHARED)
    assert [c.get_attribute("data-worker") for c in d.find_elements(By.CSS_SELECTOR, "li.card")] == [WORKER, SHARED]
    assert main.find_element(By.TAG_NAME, "h3").text == WORKER
    assert main.find_element(By.CSS_SELECTOR, ".queues").text == f"Queue: {QUEUE}"
    assert main.find_element(By.CSS_SELECTOR, ".range").text == "0 to 10 workers"
    assert shared.find_element(By.CSS_SELECTOR, ".range").text == "1 to 5 workers"
    assert "(backlog 30, 4 slots per worker)" in main.text
    assert "Wanted now: 2 workers (backlog 30, 16 slots per worker)" in shared.text  # ceil(30 / 16)
    assert main.find_element(By.CSS_SELECTOR, ".current-label").text == "Current workers"
    until(d, lambda d: "Reading" not in card(d, WORKER).find_element(By.CSS_SELECTOR, ".bar").get_attribute("title"),
          "read the current workers")
    bar = card(d, WORKER).find_element(By.CSS_SELECTOR, ".bar")
    title = bar.get_attribute("title")
    assert bar.get_attribute("role") == "img" and bar.get_attribute("aria-label") == f"Current workers: {title}"
    assert title.endswith("10 max"), title
    # Without Kubernetes the running and stopping workers are Airflow's own count of Edge
    # workers on the pool's queues: the bar shows the Sentinel's newest sample of them.
    code, body = sentinel.get(f"/v1/workers/{WORKER}/history?range=15m")
    assert code == 200, body
    newest = json.loads(body)["series"][-1]
    assert title == f"{newest['running']} running, {newest['terminating']} terminating, 10 max", (title, newest)
    assert "unknown" not in bar.get_attribute("class").split()
    # The token stays for the tab: a reload shows the list without asking again.
    assert d.execute_script(f"return sessionStorage.getItem('{TOKEN_KEY}')") == TOKEN
    d.refresh()
    until(d, lambda d: by_id(d, "workers").is_displayed(), "show the list again after a reload")
    assert not by_id(d, "token-panel").is_displayed()
    until(d, lambda d: "Wanted now: 8 workers" in card(d, WORKER).text, "show the backlog after the reload")
    workers_png = save(d, screenshots, "workers.png")

    # Keyboard: Tab to the worker's Scaling history button, Enter opens the dialog.
    button = tab_to(d, f"Scaling history of {WORKER}")
    assert button.tag_name == "button" and button.text == "Scaling history"
    style, width = focus_ring(d, button)
    assert style != "none" and width >= 2, f"no visible focus on the button: {style} {width}px"
    button.send_keys(Keys.ENTER)
    # This module's Sentinel started minutes ago: the dialog opens on the shortest range that
    # holds its recording (the page judged by its card's answer of up to 30 s before this one).
    first, status = until(d, opened, "load the range it opens on")
    code, body = sentinel.get(f"/v1/workers/{WORKER}/history?range=15m")
    assert code == 200, body
    young = json.loads(body)
    age = parse_time(young["to"]) - parse_time(young["recordingSince"])
    assert first in {opening_range(age), opening_range(age - timedelta(seconds=35))}, (first, age)
    assert first != "1d", f"a recording of {age} opened on a day"
    dialog = by_id(d, "history")
    assert dialog.get_attribute("open") is not None
    title_id = dialog.get_attribute("aria-labelledby")
    assert by_id(d, title_id).text == f"Scaling history: {WORKER}"
    assert by_id(d, "history-subtitle").text == f"Queue {QUEUE} · 0 to 10 workers"
    select = d.switch_to.active_element
    assert select.get_attribute("id") == "history-range", "the dialog did not take the focus"
    assert select.tag_name == "select" and label_of(d, select) == "Time range"
    assert [o.text for o in select.find_elements(By.TAG_NAME, "option")] == RANGES
    assert select.get_attribute("value") == first
    style, width = focus_ring(d, select)
    assert style != "none" and width >= 2, f"no visible focus on the range selector: {style} {width}px"
    message = by_id(d, "history-message").text
    if status == 404:
        assert "Scaling history is not available" in message and "404" in message, message
        assert not by_id(d, "history-body").is_displayed()
    else:
        assert status == 200 and by_id(d, "history-body").is_displayed(), (status, message)
    if status == 200 and age < dict(OPENING_RANGES)[first] * 0.9:
        # The young recording fills the chart: its time axis starts where the recording does.
        # Judged by the "recording started" mark, not by the first drawn point (on a loaded
        # machine the first refreshes may fail, and the lines rightly start where values do).
        # The axis starts at the recording's first bucket, so the mark is at most one bucket
        # from its start: within 30 of the axis' 740 px once the recording is 25 buckets old
        # (younger ones keep at least two buckets of axis, and the mark may stand anywhere).
        chart = by_id(d, "chart")
        since = float(chart.find_element(By.CSS_SELECTOR, "line.since").get_attribute("x1"))
        if age >= timedelta(seconds=25 * young["stepSeconds"]):
            assert since <= 44 + 30, f"the recording's start is drawn far from the axis' start: x={since}, age {age}"
        assert chart.find_element(By.CSS_SELECTOR, "text.since-label").get_attribute("textContent") \
            == "recording started"
        assert "the time axis starts there" in chart.find_element(By.TAG_NAME, "desc").get_attribute("textContent")
        # However short the axis, its five times read apart (seconds when they are under a
        # minute apart).
        labels = [t.get_attribute("textContent") for t in chart.find_elements(By.CSS_SELECTOR, "text.x-label")]
        assert len(labels) == 5 and len(set(labels)) == 5, f"time labels repeat: {labels}"
    if status == 200:
        drain = by_id(d, "drain-chart")
        assert drain.get_attribute("role") == "img"
        assert by_id(d, "drain-title").get_attribute("textContent").startswith("Backlog drained per minute by ")
    history_png = save(d, screenshots, "scaling-history.png")

    # Arrow Down picks the next range, and the page loads it.
    following = RANGE_VALUES[RANGE_VALUES.index(first) + 1]
    select.send_keys(Keys.ARROW_DOWN)
    until(d, lambda d: loaded_range(d, following), f"load the range chosen with the keyboard, {following}")
    assert by_id(d, "history-range").get_attribute("value") == following
    if status == 200:
        chart_title = by_id(d, "chart").get_attribute("aria-labelledby").split()[0]
        label = {"1h": "the last hour", "6h": "the last 6 hours", "1d": "the last day"}[following]
        assert by_id(d, chart_title).get_attribute("textContent") == f"Workers of {WORKER} over {label}"
        for tile in ("tile-peak", "tile-maximum", "tile-waiting", "tile-paused", "tile-held"):
            assert by_id(d, tile).get_attribute("aria-label"), f"{tile} has no label"
    save(d, screenshots, f"scaling-history-{following}.png")

    # Escape closes the dialog and gives the focus back to the button that opened it.
    ActionChains(d).send_keys(Keys.ESCAPE).perform()
    until(d, lambda d: by_id(d, "history").get_attribute("open") is None, "close the dialog on Escape")
    active = d.switch_to.active_element
    assert active.get_attribute("aria-label") == f"Scaling history of {WORKER}", "the focus was not given back"
    publish(history_png, workers_png)


def test_scaling_history_lines_tiles_and_findings(sentinel, browser):
    d = browser.driver
    sign_in(d, sentinel)
    card(d, WORKER).find_element(By.CSS_SELECTOR, ".history-button").click()
    until(d, opened, "load the range it opens on")
    Select(by_id(d, "history-range")).select_by_value("1d")
    assert until(d, lambda d: loaded_range(d, "1d"), "load the history of a day") == 200
    path = f"/v1/workers/{WORKER}/history?range=1d"
    code, body = sentinel.get(path)
    assert code == 200, body
    api = json.loads(body)
    missing = set(api["missing"])
    # The Sentinel records on; what the page shows is either this answer or a newer one.
    by_id(d, "history-range").send_keys(Keys.ARROW_DOWN)
    until(d, lambda d: loaded_range(d, "7d"), "load 7 days")
    by_id(d, "history-range").send_keys(Keys.ARROW_UP)
    until(d, lambda d: loaded_range(d, "1d"), "load 1 day again")
    code, body = sentinel.get(path)
    newer = json.loads(body)

    peak = by_id(d, "tile-peak").get_attribute("aria-label")
    assert peak in {f"Peak wanted: {a['tiles']['peakWanted']} worker{'s' if a['tiles']['peakWanted'] != 1 else ''}"
                    for a in (api, newer)}, peak
    assert by_id(d, "tile-maximum").get_attribute("aria-label").startswith("At maximum: ")
    waiting = by_id(d, "tile-waiting").get_attribute("aria-label")
    if "waiting" in missing:
        assert waiting == "Waiting for capacity: not available", waiting

    findings = [li.text for li in by_id(d, "findings").find_elements(By.TAG_NAME, "li")]
    assert findings in ([f["text"] for f in api["findings"]], [f["text"] for f in newer["findings"]]), findings
    assert by_id(d, "recorded-by").text.startswith(f"Recorded by {api['recordedBy']}")

    chart = by_id(d, "chart")
    assert chart.get_attribute("role") == "img"
    assert chart.find_element(By.TAG_NAME, "desc").get_attribute("textContent")
    if any(p["wanted"] is not None for p in api["series"]):
        wanted = chart.find_element(By.CSS_SELECTOR, 'path[data-series="wanted"]')
        assert wanted.get_attribute("d").startswith("M")
    # No Kubernetes: Workers and Waiting are missing, said under the chart and not drawn as 0;
    # Running comes from Airflow's list of Edge workers and is drawn.
    assert {"workers", "waiting"} <= missing and "running" not in missing, missing
    note = by_id(d, "missing-note").text
    assert "come from Kubernetes, which this Sentinel does not watch" in note, note
    assert "Airflow's count of online and stopping Edge workers" in note, note
    for key, label in (("workers", "Workers"), ("running", "Running")):
        drawn = chart.find_elements(By.CSS_SELECTOR, f'path[data-series="{key}"]')
        legend = d.find_element(By.CSS_SELECTOR, f'#chart-legend li[data-series="{key}"]').text
        if key in missing:
            assert not drawn, f"{key} is missing but drawn"
            assert legend == f"{label} (not available)"
        else:
            assert drawn and legend == label, (key, legend)
    # The bounds are labelled at the right end of their lines.
    labels = [t.get_attribute("textContent") for t in chart.find_elements(By.CSS_SELECTOR, "text.bound-label")]
    assert labels == ["max 10", "min 0"], labels
    # Drained per minute: a line of its own where the Sentinel measured any.
    drained = by_id(d, "drain-chart").find_elements(By.CSS_SELECTOR, 'path[data-series="drainedPerMinute"]')
    if any(isinstance(p.get("drainedPerMinute"), (int, float)) for p in api["series"]):
        assert drained and drained[0].get_attribute("d").startswith("M")
    rows = by_id(d, "decisions").find_elements(By.CSS_SELECTOR, "tbody tr")
    counts = {max(1, min(len(a["decisions"]), 500)) for a in (api, newer)}
    assert len(rows) in counts, (len(rows), counts)


# ---- drawing the contract's shape ----------------------------------------------------------


def contract_history(worker: str) -> dict:
    """A 15-minute history in the API contract's shape, with Kubernetes data: Workers and
    Running climb from 1 to the maximum of 5, one worker is terminating at the end, Running
    has no value for the first samples; the pool was paused for the 10th to 12th minutes and a
    worker ran with 8 slots where the pool assumes 4."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    start = now - timedelta(minutes=15)

    def iso(t: datetime) -> str:
        return t.isoformat().replace("+00:00", "Z")

    wanted = [1, 1, 2, 3, 4, 5, 5, 5, 5, 4, 3, 3, 3, 3, 3]
    series = []
    for minute, w in enumerate(wanted):
        series.append({"t": iso(start + timedelta(minutes=minute)), "wanted": w, "desiredReplicas": w,
                       "workers": w, "running": None if minute < 2 else min(w, 4), "waiting": 0,
                       "terminating": 1 if minute == len(wanted) - 1 else 0, "backlog": 4 * w,
                       "queued": w, "runningTasks": 3 * w, "minReplicas": 1, "maxReplicas": 5,
                       "paused": 9 <= minute <= 11,
                       "drainedPerMinute": None if minute < 3 else float(minute % 4) * 2.5})
    series[-1]["running"] = 1

    def cold_start(worker_pod: str, kind: str, began: datetime, steps_ms: list[int], outcome: str,
                   ended_by: str | None) -> dict:
        """A start with the first ``len(steps_ms) + 1`` phases, ``steps_ms`` apart."""
        at, phases, durations = began, [], []
        for i, phase in enumerate(COLD_START_PHASES[:len(steps_ms) + 1]):
            if i:
                at += timedelta(milliseconds=steps_ms[i - 1])
                durations.append({"from": COLD_START_PHASES[i - 1], "to": phase, "ms": steps_ms[i - 1]})
            phases.append({"phase": phase, "at": iso(at), "seen": "airflow" if i > 3 else "sentinel"})
        total = sum(steps_ms) if len(steps_ms) == 5 else None
        return {"worker": worker_pod, "kind": kind, "outcome": outcome, "endedBy": ended_by,
                "phases": phases, "durations": durations, "totalMs": total}

    cold_starts = {
        "phases": COLD_START_PHASES, "totalP50Ms": 4200, "totalP90Ms": 4200,
        "starts": [cold_start(f"{worker}-7c9d8-a1", "fromZero", start + timedelta(minutes=1),
                              [1500, 300, 900, 400, 1100], "complete", None),
                   cold_start(f"{worker}-7c9d8-b2", "additional", start + timedelta(minutes=3),
                              [200, 12000], "incomplete", "podDeleted")],
    }
    return {
        "worker": worker, "range": "15m", "from": iso(start), "to": iso(now), "stepSeconds": 60,
        "minReplicas": 1, "maxReplicas": 5, "syncSlots": 4,
        "recordedBy": "astro-sentinel-5f7c9-x2x4q", "recordingSince": iso(start - timedelta(hours=2)),
        "missing": [], "series": series,
        "tiles": {"peakWanted": 5, "atMaximumSeconds": 120, "waitingForCapacitySeconds": 0,
                  "pausedSeconds": 180, "heldBackSeconds": 0},
        "findings": [{"kind": "paused", "text": "Paused for 3 min.", "seconds": 180},
                     {"kind": "slotDrift", "seconds": 300,
                      "text": "Worker edge-b ran with 8 slots while the autoscaler assumed 4 for 5 min."},
                     {"kind": "atMaximum", "text": "Ran at its maximum of 5 workers for 2 min.", "seconds": 120}],
        "coldStarts": cold_starts,
        "decisions": [{"t": iso(start + timedelta(minutes=2)), "what": "desiredReplicas", "from": 1, "to": 2,
                       "queued": 2, "runningTasks": 6, "backlog": 8, "syncSlots": 4, "minReplicas": 1,
                       "maxReplicas": 5, "formula": "ceil(8 / 4) = 2, held within 1..5", "source": "airflow-api"},
                      {"t": iso(start + timedelta(minutes=3)), "what": "workers", "from": 2, "to": 3,
                       "queued": 3, "runningTasks": 9, "backlog": 12, "syncSlots": 4, "minReplicas": 1,
                       "maxReplicas": 5, "formula": "ceil(12 / 4) = 3, held within 1..5", "source": "airflow-api"}],
    }


def test_page_draws_a_contract_shaped_history_with_kubernetes_data(sentinel, browser, screenshots):
    d = browser.driver
    answer = contract_history(WORKER)
    # Before any script of the page runs: history requests get the answer above; every other
    # request (the worker list, the token check) goes to the real Sentinel.
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": f"""
        const HISTORY = {json.dumps(answer)};
        const realFetch = window.fetch.bind(window);
        window.fetch = (url, init) => String(url).includes("/history?")
          ? Promise.resolve(new Response(JSON.stringify(HISTORY),
              {{status: 200, headers: {{"Content-Type": "application/json"}}}}))
          : realFetch(url, init);
    """})
    sign_in(d, sentinel)

    # The bar: 1 running, 1 terminating (hatched) against the list's maximum of 10.
    until(d, lambda d: card(d, WORKER).find_element(By.CSS_SELECTOR, ".bar").get_attribute("title")
          == "1 running, 1 terminating, 10 max", "draw the Current workers bar")
    bar = card(d, WORKER).find_element(By.CSS_SELECTOR, ".bar")
    assert "unknown" not in bar.get_attribute("class").split()
    running = bar.find_element(By.CSS_SELECTOR, ".seg.running").size["width"]
    terminating = bar.find_element(By.CSS_SELECTOR, ".seg.terminating")
    assert abs(running - bar.size["width"] / 10) <= 1 and abs(terminating.size["width"] - running) <= 1
    assert "repeating-linear-gradient" in terminating.value_of_css_property("background-image"), "not hatched"

    card(d, WORKER).find_element(By.CSS_SELECTOR, ".history-button").click()
    # Recorded for 2 h 15 min: the shortest range that holds it is 6 hours.
    assert until(d, lambda d: loaded_range(d, "6h"), "draw the history") == 200
    chart = by_id(d, "chart")
    for key in ("wanted", "workers", "running", "minReplicas", "maxReplicas"):
        path = chart.find_element(By.CSS_SELECTOR, f'path[data-series="{key}"]').get_attribute("d")
        # One unbroken step line each: 15 samples one step apart; Running starts at the third.
        assert path.count("M") == 1, (key, path)
    running_path = chart.find_element(By.CSS_SELECTOR, 'path[data-series="running"]').get_attribute("d")
    wanted_path = chart.find_element(By.CSS_SELECTOR, 'path[data-series="wanted"]').get_attribute("d")
    running_x = float(running_path.split()[0][1:])
    wanted_x = float(wanted_path.split()[0][1:])
    assert running_x > wanted_x, "Running is drawn where it has no value"
    assert "Running: from 1 to 4" in chart.find_element(By.TAG_NAME, "desc").get_attribute("textContent")
    labels = [t.get_attribute("textContent") for t in chart.find_elements(By.CSS_SELECTOR, "text.bound-label")]
    assert labels == ["max 5", "min 1"], labels
    # Drained per minute: its own chart on the same time axis, from the fourth sample on.
    drain = by_id(d, "drain-chart")
    drained_path = drain.find_element(By.CSS_SELECTOR, 'path[data-series="drainedPerMinute"]').get_attribute("d")
    assert drained_path.count("M") == 1 and float(drained_path.split()[0][1:]) > wanted_x, drained_path
    assert by_id(d, "drain-desc").get_attribute("textContent") == \
        "Task slots drained per minute while running: from 0 to 7.5."
    assert by_id(d, "tile-maximum").find_element(By.CSS_SELECTOR, ".tile-label").text == "At maximum"
    assert by_id(d, "tile-peak").get_attribute("aria-label") == "Peak wanted: 5 workers"
    assert by_id(d, "tile-maximum").get_attribute("aria-label") == "At maximum: 2 min"
    assert by_id(d, "tile-waiting").get_attribute("aria-label") == "Waiting for capacity: Never"
    assert by_id(d, "tile-paused").get_attribute("aria-label") == "Paused: 3 min"
    assert by_id(d, "tile-held").get_attribute("aria-label") == "Held back by Airflow: Never"
    assert [li.text for li in by_id(d, "findings").find_elements(By.TAG_NAME, "li")] == [
        "Paused for 3 min.", "Worker edge-b ran with 8 slots while the autoscaler assumed 4 for 5 min.",
        "Ran at its maximum of 5 workers for 2 min."]
    # The paused minutes: a band of its own colour behind the lines, named in the legend.
    bands = chart.find_elements(By.CSS_SELECTOR, 'rect[data-series="paused"]')
    assert len(bands) == 3, len(bands)
    assert bands[0].value_of_css_property("fill") not in {
        chart.find_element(By.CSS_SELECTOR, f'path[data-series="{k}"]').value_of_css_property("stroke")
        for k in ("wanted", "workers", "running", "maxReplicas")}
    band_x = [float(b.get_attribute("x")) for b in bands]
    assert band_x == sorted(band_x) and wanted_x < band_x[0]
    assert "Paused" in [li.text for li in by_id(d, "chart-legend").find_elements(By.TAG_NAME, "li")]
    assert "paused for part of the period" in chart.find_element(By.TAG_NAME, "desc").get_attribute("textContent")
    assert not by_id(d, "missing-note").is_displayed()
    assert by_id(d, "recorded-by").text.startswith("Recorded by astro-sentinel-5f7c9-x2x4q since ")
    rows = by_id(d, "decisions").find_elements(By.CSS_SELECTOR, "tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == ["Workers 2 → 3", "Wanted 1 → 2"]
    assert rows[0].find_elements(By.TAG_NAME, "td")[5].text == "ceil(12 / 4) = 3, held within 1..5"
    # Cold starts, newest first: a bar segment per phase timed, on one scale.
    assert by_id(d, "cold-starts-summary").text == (
        "2 starts in this period, 1 complete; backlog seen → first task running: p50 4.2 s, p90 4.2 s.")
    starts = by_id(d, "cold-starts-list").find_elements(By.CSS_SELECTOR, "li.cold-start")
    assert [li.get_attribute("data-outcome") for li in starts] == ["incomplete", "complete"]
    assert starts[0].find_element(By.CSS_SELECTOR, ".cold-start-total").text == \
        "incomplete: its Pod was deleted first"
    assert starts[1].find_element(By.CSS_SELECTOR, ".cold-start-total").text == "total 4.2 s"
    assert "from zero" in starts[1].text and "additional worker" in starts[0].text
    assert len(starts[1].find_elements(By.CSS_SELECTOR, "rect")) == 5
    assert len(starts[0].find_elements(By.CSS_SELECTOR, "rect")) == 2
    widths = [float(r.get_attribute("width")) for r in starts[1].find_elements(By.CSS_SELECTOR, "rect")]
    assert abs(sum(widths) - 400 * 4200 / 12200) < 1, widths  # the longest bar shown spans 400
    legend = [li.text for li in by_id(d, "cold-starts-legend").find_elements(By.TAG_NAME, "li")]
    assert legend == ["Replicas raised", "Pod scheduled", "Container started", "Agent registered",
                      "First task running"]
    save(d, screenshots, "contract-shaped-history.png")
    d.execute_script("document.getElementById('cold-starts').scrollIntoView()")
    save(d, screenshots, "contract-shaped-cold-starts.png")


def test_a_fixed_size_pool_has_its_own_at_maximum_tile(sentinel, browser):
    """Min = max: the tile is the time the backlog wanted more than the pool's fixed size."""
    d = browser.driver
    answer = contract_history(WORKER)
    answer["minReplicas"] = answer["maxReplicas"] = 5
    answer["tiles"]["atMaximumSeconds"] = 90
    answer["findings"] = [{"kind": "fixedSize", "seconds": 900,
                           "text": "Fixed at 5 workers (20 slots): 35% of its slots ran tasks."}]
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": f"""
        const HISTORY = {json.dumps(answer)};
        const realFetch = window.fetch.bind(window);
        window.fetch = (url, init) => String(url).includes("/history?")
          ? Promise.resolve(new Response(JSON.stringify(HISTORY),
              {{status: 200, headers: {{"Content-Type": "application/json"}}}}))
          : realFetch(url, init);
    """})
    sign_in(d, sentinel)
    card(d, WORKER).find_element(By.CSS_SELECTOR, ".history-button").click()
    assert until(d, lambda d: loaded_range(d, "6h"), "draw the history") == 200
    tile = by_id(d, "tile-maximum")
    assert tile.find_element(By.CSS_SELECTOR, ".tile-label").text == "Backlog beyond its size"
    assert tile.get_attribute("aria-label") == "Backlog beyond its size: 1 min 30 s"
    assert [li.text for li in by_id(d, "findings").find_elements(By.TAG_NAME, "li")] == [
        "Fixed at 5 workers (20 slots): 35% of its slots ran tasks."]


def test_the_page_writes_durations_by_the_findings_rule(sentinel, browser):
    """The page's durations against the table the Sentinel's findings are tested on."""
    d = browser.driver
    d.get(page_url(sentinel))
    until(d, lambda d: d.execute_script("return typeof humanDuration") == "function", "load duration.js")
    cases = json.loads(DURATION_TABLE.read_text())["cases"]
    written = d.execute_script("return arguments[0].map(([s]) => humanDuration(s))", cases)
    assert [[s, w] for (s, _), w in zip(cases, written)] == cases
