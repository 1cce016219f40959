"use strict";
// The Sentinel's page: the worker list from GET /v1/workers and each worker's scaling history
// from GET /v1/workers/{name}/history. Plain DOM code, no framework and nothing fetched from
// elsewhere: the Sentinel serves it from its own binary under a strict Content-Security-Policy
// (no inline script or style, so everything is built with createElement and textContent,
// which also keeps names from the API from ever being parsed as HTML).
//
// URLs are relative ("../v1/…"), so the page also works behind a path prefix, such as the
// API server's service proxy.

(() => {
  const TOKEN_KEY = "astro-sentinel-token";
  const REFRESH_MS = 30000;
  // The range the worker cards read their "now" from: the shortest, so the cheapest.
  const CARD_RANGE = "15m";
  // The dialog opens on the default range, or a shorter one that holds a young recording.
  const DEFAULT_RANGE = "1d";
  const OPENING_RANGES = [["15m", 15 * 60000], ["1h", 3600000], ["6h", 6 * 3600000]];
  const MAX_DECISION_ROWS = 500;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const RANGE_LABELS = {
    "15m": "the last 15 minutes",
    "1h": "the last hour",
    "6h": "the last 6 hours",
    "1d": "the last day",
    "7d": "the last 7 days",
    "14d": "the last 14 days",
  };
  // Series names in the history's `missing` field, as people read them.
  const MISSING_LABELS = {
    workers: "Workers",
    running: "Running",
    waiting: "Waiting for capacity",
    terminating: "Terminating",
  };
  // Drawn in this order: the bounds under the lines that matter.
  const LINES = [
    { key: "maxReplicas", label: "Max", cls: "line-max" },
    { key: "minReplicas", label: "Min", cls: "line-min" },
    { key: "workers", label: "Workers", cls: "line-workers" },
    { key: "running", label: "Running", cls: "line-running" },
    { key: "wanted", label: "Wanted", cls: "line-wanted" },
  ];

  // Cold-start phases by their API names, as people read them (each bar segment is named
  // by the phase it ends at).
  const PHASES = {
    backlogSeen: "Backlog seen",
    replicasRaised: "Replicas raised",
    podScheduled: "Pod scheduled",
    containerStarted: "Container started",
    agentRegistered: "Agent registered",
    firstTaskRunning: "First task running",
  };
  const ENDED_BY = {
    podDeleted: "its Pod was deleted first",
    workerGone: "the worker left first",
    timedOut: "no task within 15 minutes",
  };
  const MAX_COLD_STARTS = 20;

  const $ = (id) => document.getElementById(id);

  // ---- DOM helpers ---------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    setAttrs(e, attrs);
    for (const c of children) {
      if (c !== null && c !== undefined) e.append(c);
    }
    return e;
  }

  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    setAttrs(e, attrs);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function setAttrs(e, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) e.setAttribute(k, String(v));
    }
  }

  function plural(n, one, many) {
    return `${n} ${n === 1 ? one : many}`;
  }

  function rangeText(min, max) {
    if (min === max) return plural(max, "worker", "workers");
    return `${min} to ${plural(max, "worker", "workers")}`;
  }

  // A tile's time, by the findings' rule (duration.js); a tile with no time at all reads "Never".
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "not available";
    return Math.round(seconds) <= 0 ? "Never" : humanDuration(seconds);
  }

  function timeOfDay(ms) {
    return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  function dateAndTime(ms) {
    return new Date(ms).toLocaleString([], {
      month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
    });
  }

  // ---- the API ---------------------------------------------------------------------------

  const token = {
    get: () => sessionStorage.getItem(TOKEN_KEY),
    set: (t) => sessionStorage.setItem(TOKEN_KEY, t),
    forget: () => sessionStorage.removeItem(TOKEN_KEY),
  };

  // GET a JSON endpoint with the tab's token, if any (with `auth.disabled` none is needed).
  // Never throws: a network failure is status 0. `sentToken` is the token this request
  // carried, so that a refusal is pinned on that token and not on one entered meanwhile.
  async function getJson(path) {
    const headers = { Accept: "application/json" };
    const sentToken = token.get();
    if (sentToken) headers.Authorization = `Bearer ${sentToken}`;
    let response;
    try {
      response = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    } catch (e) {
      return { status: 0, body: null, error: `cannot reach the Sentinel (${e.message})`, sentToken };
    }
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      // Not JSON: the status says enough.
    }
    const error = body && typeof body.error === "string" ? body.error : `HTTP ${response.status}`;
    return { status: response.status, body, error, sentToken };
  }

  function historyPath(name, range) {
    return `../v1/workers/${encodeURIComponent(name)}/history?range=${encodeURIComponent(range)}`;
  }

  const isAuthFailure = (r) => r.status === 401 || r.status === 403;

  // ---- page state ------------------------------------------------------------------------

  const state = {
    cards: new Map(), // worker name → { li, ... } built once, updated in place
    workers: new Map(), // worker name → its latest /v1/workers entry
    cardIds: 0, // element ids of cards, never reused
    listSeq: 0,
    dialogWorker: null,
    opener: null,
    historySeq: 0,
  };

  function setStatus(text) {
    $("status").textContent = text;
  }

  // ---- the token -------------------------------------------------------------------------

  function showTokenPanel(result) {
    if (result.sentToken !== token.get()) {
      // Another token was entered while this request was under way: its own answer decides.
      return;
    }
    let problem;
    if (result.status === 401 && result.sentToken) {
      problem = `The Sentinel refused the token you entered (401: ${result.error}). Enter another one.`;
    } else if (result.status === 403) {
      problem = `The Sentinel refused this token's identity (403: ${result.error}). Use a token of an allowed identity.`;
    } else {
      problem = "This Sentinel needs a bearer token before it shows its workers.";
    }
    // A refused token is of no further use; a new one is asked for.
    token.forget();
    closeHistory();
    $("workers").hidden = true;
    $("forget-token").hidden = true;
    $("token-problem").textContent = problem;
    $("token-panel").hidden = false;
    setStatus("");
    // The field is described by the problem: moving the focus there reads it out.
    $("token-input").focus();
  }

  function onTokenSubmit(event) {
    event.preventDefault();
    const input = $("token-input");
    const t = input.value.trim();
    if (!t) return;
    token.set(t);
    input.value = "";
    refreshWorkers({ focusList: true });
  }

  function onForgetToken() {
    token.forget();
    state.listSeq += 1; // a list request still in flight must not bring the workers back
    for (const card of state.cards.values()) card.li.remove();
    state.cards.clear();
    state.workers.clear();
    showTokenPanel({ status: 0, sentToken: null });
  }

  // ---- the worker list -------------------------------------------------------------------

  async function refreshWorkers(options = {}) {
    const seq = ++state.listSeq;
    const r = await getJson("../v1/workers");
    if (seq !== state.listSeq) return;
    if (isAuthFailure(r)) {
      showTokenPanel(r);
      return;
    }
    if (r.status !== 200 || !r.body || !Array.isArray(r.body.workers)) {
      setStatus(`Cannot read the workers: the Sentinel answered ${r.status || "nothing"} (${r.error}).`);
      return;
    }
    $("token-panel").hidden = true;
    $("workers").hidden = false;
    $("forget-token").hidden = !token.get();
    renderWorkers(r.body.workers);
    setStatus("");
    // Not in the live region: a screen reader is not told the time every refresh.
    $("updated").textContent = `${plural(r.body.workers.length, "worker", "workers")}, updated ${timeOfDay(Date.now())}`;
    if (options.focusList) $("workers-heading").focus();
    await Promise.all(r.body.workers.map((w) => refreshCurrent(w.worker, seq)));
    if (seq === state.listSeq) updateHistoryNote();
  }

  function renderWorkers(workers) {
    const seen = new Set();
    const list = $("worker-list");
    workers.forEach((w, index) => {
      seen.add(w.worker);
      state.workers.set(w.worker, w);
      let card = state.cards.get(w.worker);
      if (!card) {
        card = buildCard(w.worker);
        state.cards.set(w.worker, card);
      }
      // Keep the API's order, moving a card only when it is out of place: moving a node
      // takes the keyboard focus off its button.
      const at = list.children[index];
      if (at !== card.li) list.insertBefore(card.li, at || null);
      updateCard(card, w);
    });
    for (const [name, card] of state.cards) {
      if (!seen.has(name)) {
        card.li.remove();
        state.cards.delete(name);
        state.workers.delete(name);
      }
    }
  }

  function buildCard(name) {
    state.cardIds += 1;
    const id = `card-${state.cardIds}`;
    const card = {
      history: null, // the CARD_RANGE answer: { status, body, error }
      queues: el("p", { class: "queues" }),
      range: el("p", { class: "range" }),
      running: el("span", { class: "seg running" }),
      terminating: el("span", { class: "seg terminating" }),
      barText: el("p", { class: "bar-text" }),
      now: el("p", { class: "now" }),
      button: el("button", {
        type: "button",
        class: "history-button",
        "aria-label": `Scaling history of ${name}`,
      }, "Scaling history"),
    };
    card.bar = el("div", { class: "bar", role: "img" }, card.running, card.terminating);
    card.li = el("li", { class: "card", "data-worker": name, "aria-labelledby": `${id}-name` },
      el("h3", { id: `${id}-name` }, name),
      card.queues,
      card.range,
      el("div", { class: "current" },
        el("p", { class: "current-label" }, "Current workers"),
        card.bar,
        card.barText),
      card.now,
      card.button);
    card.button.addEventListener("click", () => openHistory(name, card.button));
    return card;
  }

  function updateCard(card, w) {
    card.queues.textContent = `${w.queues.length === 1 ? "Queue" : "Queues"}: ${w.queues.join(", ")}`;
    card.range.textContent = rangeText(w.minReplicas, w.maxReplicas);
    if (w.available) {
      card.now.textContent = `Wanted now: ${plural(w.desiredReplicas, "worker", "workers")} `
        + `(backlog ${w.backlog}, ${w.syncSlots} slots per worker)`;
      card.now.classList.remove("problem");
    } else {
      card.now.textContent = `Backlog not available: ${w.error}`;
      card.now.classList.add("problem");
    }
    renderBar(card, w);
  }

  // The Current workers bar: running workers, and terminating ones hatched, against the
  // pool's maximum. Both come from the newest sample of the worker's history; without one,
  // the bar stays empty and says why — an unknown count is not drawn as 0.
  function renderBar(card, w) {
    const { known, running, terminating, label } = currentWorkers(card.history, w);
    // Wider than the maximum while a rollout overlaps old and new pods: scale to fit.
    const scale = Math.max(w.maxReplicas, running + terminating, 1);
    // CSSOM, not a style attribute: the Content-Security-Policy allows the former only.
    card.running.style.width = `${(100 * running) / scale}%`;
    card.terminating.style.width = `${(100 * terminating) / scale}%`;
    card.bar.classList.toggle("unknown", !known);
    card.bar.title = label;
    card.bar.setAttribute("aria-label", `Current workers: ${label}`);
    card.barText.textContent = label;
  }

  // What the bar shows, from the newest sample of the card's history answer `h`.
  function currentWorkers(h, w) {
    const max = `${w.maxReplicas} max`;
    const unknown = (why) => ({ known: false, running: 0, terminating: 0, label: `${why}. ${max}` });
    if (!h) return unknown("Reading the current workers…");
    if (h.status === 404) return unknown("Running workers not known: this Sentinel has no scaling history");
    if (h.status !== 200) {
      return unknown(`Running workers not known: the history answered ${h.status || "nothing"} (${h.error})`);
    }
    const missing = new Set(h.body.missing || []);
    if (missing.has("running")) {
      return unknown(`Running workers not available: ${runningSourceText(missing)}`);
    }
    const series = h.body.series || [];
    const last = series.length ? series[series.length - 1] : null;
    if (!last || typeof last.running !== "number") return unknown("Running workers not known yet: no sample recorded");
    const parts = [`${last.running} running`];
    let terminating = 0;
    if (!missing.has("terminating") && typeof last.terminating === "number") {
      terminating = last.terminating;
      parts.push(`${terminating} terminating`);
    }
    parts.push(max);
    return { known: true, running: last.running, terminating, label: parts.join(", ") };
  }

  async function refreshCurrent(name, seq) {
    const r = await getJson(historyPath(name, CARD_RANGE));
    const card = state.cards.get(name);
    if (!card || seq !== state.listSeq) return;
    if (isAuthFailure(r)) {
      showTokenPanel(r);
      return;
    }
    card.history = r;
    renderBar(card, state.workers.get(name));
  }

  // One line above the cards when no worker has a history to show.
  function updateHistoryNote() {
    const note = $("history-note");
    const cards = [...state.cards.values()];
    const unavailable = cards.length > 0 && cards.every((c) => c.history && c.history.status === 404);
    note.hidden = !unavailable;
    note.textContent = unavailable
      ? "Scaling history is not available: this Sentinel answers 404 for /v1/workers/{name}/history "
        + "(a version without it). The list shows what /v1/workers gives."
      : "";
  }

  // ---- the scaling history dialog ---------------------------------------------------------

  function openHistory(name, opener) {
    state.dialogWorker = name;
    state.opener = opener;
    const w = state.workers.get(name);
    $("history-title").textContent = `Scaling history: ${name}`;
    $("history-subtitle").textContent = w
      ? `${w.queues.length === 1 ? "Queue" : "Queues"} ${w.queues.join(", ")} · ${rangeText(w.minReplicas, w.maxReplicas)}`
      : "";
    $("history-range").value = openingRange(state.cards.get(name));
    $("history-body").hidden = true;
    const dialog = $("history");
    dialog.removeAttribute("data-loaded-range");
    dialog.removeAttribute("data-history-status");
    dialog.showModal();
    $("history-range").focus();
    loadHistory(true);
  }

  // The shortest range that holds the whole recording, from the card's newest answer, so that
  // minutes after an install the chart is not squeezed into the last pixels of a day; a
  // recording older than that, or none known, opens on the default day.
  function openingRange(card) {
    const body = card && card.history && card.history.status === 200 ? card.history.body : null;
    const since = body && body.recordingSince ? Date.parse(body.recordingSince) : NaN;
    const now = body ? Date.parse(body.to) : NaN;
    if (!Number.isFinite(since) || !Number.isFinite(now)) return DEFAULT_RANGE;
    const opening = OPENING_RANGES.find(([, ms]) => now - since <= ms);
    return opening ? opening[0] : DEFAULT_RANGE;
  }

  function closeHistory() {
    const dialog = $("history");
    if (dialog.open) dialog.close();
  }

  // Closing by Escape, by the Close button or by close() all end here.
  function onHistoryClosed() {
    state.dialogWorker = null;
    state.historySeq += 1;
    const opener = state.opener;
    state.opener = null;
    // Not when the list was hidden meanwhile (a refused token): the token field keeps it.
    if (opener && opener.checkVisibility()) opener.focus();
  }

  // `announce`: say "Loading…" (a range the user chose), or not (the periodic refresh, which
  // would otherwise speak up in the live region every 30 s).
  async function loadHistory(announce) {
    const name = state.dialogWorker;
    if (!name) return;
    const range = $("history-range").value;
    const seq = ++state.historySeq;
    const dialog = $("history");
    dialog.setAttribute("aria-busy", "true");
    if (announce) $("history-message").textContent = `Loading ${RANGE_LABELS[range]}…`;
    const r = await getJson(historyPath(name, range));
    if (seq !== state.historySeq) return; // closed, or another range was chosen meanwhile
    dialog.removeAttribute("aria-busy");
    if (isAuthFailure(r)) {
      showTokenPanel(r);
      return;
    }
    if (r.status === 200 && r.body && Array.isArray(r.body.series)) {
      $("history-message").textContent = "";
      renderHistory(r.body, range);
      $("history-body").hidden = false;
    } else {
      $("history-body").hidden = true;
      $("history-message").textContent = r.status === 404
        ? `Scaling history is not available: this Sentinel answered 404 for the history of ${name} `
          + "(a version without /v1/workers/{name}/history)."
        : `Cannot read the scaling history: the Sentinel answered ${r.status || "nothing"} (${r.error}).`;
    }
    // Set last: tests and assistive tools can wait for the range that is now on screen.
    dialog.setAttribute("data-history-status", String(r.status));
    dialog.setAttribute("data-loaded-range", range);
  }

  function renderHistory(h, range) {
    const missing = new Set(h.missing || []);
    const tiles = h.tiles || {};
    setTile("tile-peak", "Peak wanted",
      typeof tiles.peakWanted === "number" ? plural(tiles.peakWanted, "worker", "workers") : "not available");
    // A fixed-size pool is always at its count: its tile is the time the backlog wanted more.
    const fixedSize = h.minReplicas === h.maxReplicas && h.maxReplicas > 0;
    const maximumLabel = fixedSize ? "Backlog beyond its size" : "At maximum";
    $("tile-maximum").querySelector(".tile-label").textContent = maximumLabel;
    setTile("tile-maximum", maximumLabel, duration(tiles.atMaximumSeconds));
    setTile("tile-waiting", "Waiting for capacity",
      missing.has("waiting") ? "not available" : duration(tiles.waitingForCapacitySeconds));
    setTile("tile-paused", "Paused", duration(tiles.pausedSeconds));
    setTile("tile-held", "Held back by Airflow", duration(tiles.heldBackSeconds));

    const frame = chartFrame(h);
    renderChart(h, range, missing, frame);
    renderDrainChart(h, range, frame);

    const note = $("missing-note");
    note.hidden = missing.size === 0;
    note.textContent = missingText(missing);

    const findings = $("findings");
    findings.replaceChildren(...(h.findings || []).map((f) =>
      el("li", { class: `finding finding-${f.kind}`, "data-kind": f.kind }, f.text)));
    if (!findings.children.length) findings.append(el("li", { class: "finding" }, "No findings for this period."));

    const since = h.recordingSince ? Date.parse(h.recordingSince) : null;
    $("recorded-by").textContent = since
      ? `Recorded by ${h.recordedBy} since ${dateAndTime(since)}. Each Sentinel replica keeps its own record.`
      : `Recorded by ${h.recordedBy}, which has not recorded anything for this worker yet.`;
    $("history-kept").textContent = keptText(h.historyKept, h.scaledBy);

    renderColdStarts(h.coldStarts || { starts: [], phases: [] });
    renderDecisions(h.decisions || [], (h.preWarm && h.preWarm.entries) || []);
  }

  // Where the history lives and what scales the pool: what a reader needs to trust it.
  function keptText(kept, scaledBy) {
    const where = {
      memory: "This history is kept in memory only: it is lost when the Sentinel restarts.",
      pod: "This history is volatile: it is kept in the Pod's own volume and lost when the Pod goes.",
    }[kept] || "";
    const hpa = scaledBy === "hpa"
      ? "An HPA scales this pool: KEDA does not read it from the Sentinel, which only records it."
      : "";
    return [where, hpa].filter(Boolean).join(" ");
  }

  function seconds(ms) {
    return ms < 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 1000)} s`;
  }

  // One stacked bar per start, newest first: the time between each two phases it went
  // through, on one scale for all bars shown, and the p50/p90 of the totals above.
  function renderColdStarts(c) {
    const starts = [...c.starts].reverse().slice(0, MAX_COLD_STARTS);
    const complete = c.starts.filter((s) => s.outcome === "complete").length;
    $("cold-starts-summary").textContent = !c.starts.length
      ? "No cold start in this period."
      : `${plural(c.starts.length, "start", "starts")} in this period, ${complete} complete`
        + (typeof c.totalP50Ms === "number"
          ? `; backlog seen → first task running: p50 ${seconds(c.totalP50Ms)}, p90 ${seconds(c.totalP90Ms)}.`
          : "; none measured from backlog seen to first task running.");
    $("cold-starts-legend").replaceChildren(...c.phases.slice(1).map((p) =>
      el("li", { class: "legend-item" }, el("span", { class: `phase-box phase-${p}` }), PHASES[p] || p)));
    const longest = Math.max(1, ...starts.map((s) => s.durations.reduce((sum, d) => sum + d.ms, 0)));
    $("cold-starts-list").replaceChildren(...starts.map((s) => coldStartRow(s, longest)));
  }

  function coldStartRow(s, longest) {
    const width = 400;
    const height = 14;
    const svg = svgEl("svg", { class: "cold-start-bar", viewBox: `0 0 ${width} ${height}`, width, height,
      role: "img", "aria-label": s.durations.map((d) => `${PHASES[d.to] || d.to} ${seconds(d.ms)}`).join(", ") || "no phases timed" });
    let x = 0;
    for (const d of s.durations) {
      const w = (d.ms / longest) * width;
      const rect = svgEl("rect", { class: `phase-${d.to}`, x, y: 0, width: Math.max(w, 1), height });
      rect.append(svgEl("title", {}, `${PHASES[d.from] || d.from} → ${PHASES[d.to] || d.to}: ${seconds(d.ms)}`));
      svg.append(rect);
      x += w;
    }
    const began = s.phases.length ? dateAndTime(Date.parse(s.phases[0].at)) : "";
    const outcome = s.outcome === "complete"
      ? (typeof s.totalMs === "number" ? `total ${seconds(s.totalMs)}` : "complete (began before this Sentinel saw it)")
      : s.outcome === "inProgress" ? "in progress" : `incomplete: ${ENDED_BY[s.endedBy] || s.endedBy}`;
    return el("li", { class: "cold-start", "data-outcome": s.outcome, "data-kind": s.kind },
      el("span", { class: "cold-start-label" },
        `${began} · ${s.kind === "fromZero" ? "from zero" : "additional worker"} · ${s.worker}`),
      svg,
      el("span", { class: "cold-start-total" }, outcome));
  }

  // Why the running workers are unknown. Without Kubernetes (no Workers line either) they
  // come from Airflow's list of Edge workers, so that list could not be read.
  function runningSourceText(missing) {
    return missing.has("workers")
      ? "neither Kubernetes (not watched by this Sentinel) nor Airflow's list of Edge workers told them"
      : "the Sentinel recorded none in this period";
  }

  // The note under the chart: which lines are not drawn, and where the drawn ones come from.
  function missingText(missing) {
    if (!missing.size) return "";
    const names = [...missing].map((m) => MISSING_LABELS[m] || m);
    const verb = names.length === 1 ? "is" : "are";
    if (!missing.has("workers")) return `${listText(names)} ${verb} not recorded in this period.`;
    const fromAirflow = missing.has("running")
      ? "Airflow's list of Edge workers could not be read either, so only Wanted and the range are drawn."
      : "Running and Terminating are Airflow's count of online and stopping Edge workers on the pool's queues.";
    return `${listText(names)} ${verb} not available: they come from Kubernetes, which this Sentinel does not watch. ${fromAirflow}`;
  }

  function listText(items) {
    if (items.length < 2) return items.join("");
    return `${items.slice(0, -1).join(", ")} and ${items[items.length - 1]}`;
  }

  function setTile(id, label, value) {
    const tile = $(id);
    tile.querySelector(".tile-value").textContent = value;
    tile.setAttribute("aria-label", `${label}: ${value}`);
  }

  // The changes, and what pre-warming from the schedule did (one sentence each), newest first.
  function renderDecisions(decisions, preWarm) {
    const table = $("decisions");
    const rows = [...decisions, ...preWarm.map((p) => ({ ...p, what: "preWarm" }))];
    const newest = rows.sort((a, b) => Date.parse(b.t) - Date.parse(a.t));
    const shown = newest.slice(0, MAX_DECISION_ROWS);
    table.tBodies[0].replaceChildren(...shown.map((d) => d.what === "preWarm"
      ? el("tr", { "data-what": d.what, "data-outcome": d.outcome },
        el("td", {}, dateAndTime(Date.parse(d.t))),
        el("td", { colspan: 5 }, d.text),
        el("td", {}, "schedule"))
      : el("tr", { "data-what": d.what },
      el("td", {}, dateAndTime(Date.parse(d.t))),
      el("td", {}, `${d.what === "desiredReplicas" ? "Wanted" : d.what === "workers" ? "Workers" : d.what} ${d.from} → ${d.to}`),
      el("td", { class: "num" }, String(d.queued)),
      el("td", { class: "num" }, String(d.runningTasks)),
      el("td", { class: "num" }, String(d.backlog)),
      el("td", { class: "formula" }, d.formula),
      el("td", {}, d.source))));
    if (!shown.length) {
      table.tBodies[0].append(el("tr", {}, el("td", { colspan: 7 }, "No changes in this period.")));
    }
    table.caption.textContent = shown.length < newest.length
      ? `Decision log: the newest ${shown.length} of ${newest.length} changes`
      : `Decision log: ${plural(newest.length, "change", "changes")}, newest first`;
  }

  // ---- the chart ---------------------------------------------------------------------------

  const CHART = { width: 800, height: 300, left: 44, right: 16, top: 14, bottom: 30 };

  // The time axis of both charts. A recording younger than the range starts the axis where it
  // starts (at its first bucket, and at least two buckets back from now), so that minutes of
  // data fill the chart instead of its last pixels.
  function chartFrame(h) {
    const rangeFrom = Date.parse(h.from);
    const to = Date.parse(h.to);
    const step = Math.max(h.stepSeconds || 60, 1) * 1000;
    const points = (h.series || [])
      .map((p) => ({ ...p, ms: Date.parse(p.t) }))
      .filter((p) => Number.isFinite(p.ms))
      .sort((a, b) => a.ms - b.ms);
    const since = h.recordingSince ? Date.parse(h.recordingSince) : NaN;
    let from = rangeFrom;
    if (since > rangeFrom && since < to) {
      const first = points.length ? Math.min(points[0].ms, since) : since;
      from = Math.max(rangeFrom, Math.min(first, to - 2 * step));
    }
    return { from, to, span: Math.max(to - from, 1), step, points, since, young: from > rangeFrom };
  }

  // Time labels under a chart: five, dates on ranges longer than a day and a half, and seconds
  // where the labels are less than a minute apart (a recording a few seconds old), which would
  // otherwise all read the same minute.
  function timeAxis(axes, frame, c, x, fmt) {
    const long = frame.span > 36 * 3600 * 1000;
    const short = frame.span / 4 < 60 * 1000;
    for (let i = 0; i <= 4; i += 1) {
      const ms = frame.from + (frame.span * i) / 4;
      const label = long
        ? new Date(ms).toLocaleDateString([], { month: "short", day: "numeric" })
        : short
          ? new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" })
          : timeOfDay(ms);
      const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
      axes.append(svgEl("text", { class: "x-label", x: fmt(x(ms)), y: c.height - 8, "text-anchor": anchor }, label));
    }
  }

  function renderChart(h, range, missing, frame) {
    const { from, to, span, step, points } = frame;
    const drawn = LINES.filter((l) => !missing.has(l.key));

    let top = Math.max(1, h.maxReplicas || 0);
    for (const p of points) {
      for (const l of drawn) if (typeof p[l.key] === "number") top = Math.max(top, p[l.key]);
    }
    const tick = Math.max(1, Math.ceil(top / 5));
    // Headroom above the highest value, so the max line does not sit on the frame.
    top = Math.ceil((top + tick / 2) / tick) * tick;

    const c = CHART;
    const plotW = c.width - c.left - c.right;
    const plotH = c.height - c.top - c.bottom;
    const x = (ms) => c.left + ((ms - from) / span) * plotW;
    const y = (v) => c.top + plotH - (v / top) * plotH;
    const fmt = (n) => Math.round(n * 10) / 10;

    const titleId = "chart-title";
    const descId = "chart-desc";
    const svg = svgEl("svg", {
      id: "chart",
      viewBox: `0 0 ${c.width} ${c.height}`,
      role: "img",
      "aria-labelledby": `${titleId} ${descId}`,
      "data-range": range,
    });
    svg.append(svgEl("title", { id: titleId }, `Workers of ${h.worker} over ${RANGE_LABELS[range]}`));
    svg.append(svgEl("desc", { id: descId }, chartSummary(points, missing)
      + (frame.young ? ` The recording started at ${timeOfDay(frame.since)}; the time axis starts there.` : "")));

    const axes = svgEl("g", { class: "axes", "aria-hidden": "true" });
    for (let v = 0; v <= top; v += tick) {
      axes.append(svgEl("line", { class: "grid", x1: c.left, x2: c.width - c.right, y1: fmt(y(v)), y2: fmt(y(v)) }));
      axes.append(svgEl("text", { class: "y-label", x: c.left - 8, y: fmt(y(v) + 4) }, String(v)));
    }
    timeAxis(axes, frame, c, x, fmt);
    svg.append(axes);

    const since = frame.since;
    if (since >= from && since < to) {
      const sx = fmt(x(since));
      svg.append(svgEl("line", { class: "since", x1: sx, x2: sx, y1: c.top, y2: c.top + plotH }));
      // Written on the side with room, so that a recent start is not cut off at the edge.
      const left = sx > c.left + plotW / 2;
      svg.append(svgEl("text", {
        class: "since-label", x: left ? sx - 4 : sx + 4, y: c.top + 10, "text-anchor": left ? "end" : "start",
      }, "recording started"));
    }

    // Paused time first, so that the lines are drawn over it.
    const paused = points.filter((p) => p.paused === true);
    for (const p of paused) {
      const x1 = fmt(x(p.ms));
      const x2 = fmt(x(Math.min(p.ms + step, to)));
      svg.append(svgEl("rect", {
        class: "paused-band", "data-series": "paused", x: x1, y: c.top, width: fmt(Math.max(x2 - x1, 1)), height: plotH,
      }));
    }

    for (const line of drawn) {
      const d = linePath(points, line.key, step, to, x, y, fmt);
      if (d) {
        svg.append(svgEl("path", { class: `line ${line.cls}`, "data-series": line.key, d }));
      }
    }
    svg.append(...boundLabels(points, drawn, c, y, fmt));
    if (!points.length) {
      svg.append(svgEl("text", { class: "empty", x: c.left + plotW / 2, y: c.top + plotH / 2, "text-anchor": "middle" },
        "No samples in this period yet"));
    }
    $("chart-box").replaceChildren(svg);

    const legend = LINES.slice().reverse().map((l) => el("li",
      { class: missing.has(l.key) ? "legend-item absent" : "legend-item", "data-series": l.key },
      el("span", { class: `swatch ${l.cls}`, "aria-hidden": "true" }),
      missing.has(l.key) ? `${l.label} (not available)` : l.label));
    if (paused.length) {
      legend.push(el("li", { class: "legend-item", "data-series": "paused" },
        el("span", { class: "swatch paused-band", "aria-hidden": "true" }), "Paused"));
    }
    $("chart-legend").replaceChildren(...legend);
  }

  const DRAIN_CHART = { width: 800, height: 130, left: 44, right: 16, top: 12, bottom: 26 };

  // Drained per minute, on the time axis of the workers chart: the task slots the backlog
  // fell by per minute the pool ran. A lower bound while work keeps arriving (what arrives
  // hides as much of the drain), and no point where nothing ran.
  function renderDrainChart(h, range, frame) {
    const { from, to, span, step, points } = frame;
    const c = DRAIN_CHART;
    const plotW = c.width - c.left - c.right;
    const plotH = c.height - c.top - c.bottom;
    const values = points.map((p) => p.drainedPerMinute).filter((v) => typeof v === "number");
    let top = Math.max(1, ...values);
    const tick = niceTick(top / 2);
    top = Math.ceil(top / tick) * tick;
    const x = (ms) => c.left + ((ms - from) / span) * plotW;
    const y = (v) => c.top + plotH - (v / top) * plotH;
    const fmt = (n) => Math.round(n * 10) / 10;
    const svg = svgEl("svg", {
      id: "drain-chart", viewBox: `0 0 ${c.width} ${c.height}`, role: "img",
      "aria-labelledby": "drain-title drain-desc", "data-range": range,
    });
    svg.append(svgEl("title", { id: "drain-title" }, `Backlog drained per minute by ${h.worker} over ${RANGE_LABELS[range]}`));
    const lo = values.length ? Math.min(...values) : 0;
    const hi = values.length ? Math.max(...values) : 0;
    svg.append(svgEl("desc", { id: "drain-desc" }, !values.length
      ? "No drain measured in this period: nothing ran, or no two samples followed each other."
      : `Task slots drained per minute while running: ${lo === hi ? lo : `from ${lo} to ${hi}`}.`));
    const axes = svgEl("g", { class: "axes", "aria-hidden": "true" });
    for (let v = 0; v <= top; v += tick) {
      axes.append(svgEl("line", { class: "grid", x1: c.left, x2: c.width - c.right, y1: fmt(y(v)), y2: fmt(y(v)) }));
      axes.append(svgEl("text", { class: "y-label", x: c.left - 8, y: fmt(y(v) + 4) }, String(v)));
    }
    timeAxis(axes, frame, c, x, fmt);
    svg.append(axes);
    const d = linePath(points, "drainedPerMinute", step, to, x, y, fmt);
    if (d) svg.append(svgEl("path", { class: "line line-drained", "data-series": "drainedPerMinute", d }));
    if (!values.length) {
      svg.append(svgEl("text", { class: "empty", x: c.left + plotW / 2, y: c.top + plotH / 2, "text-anchor": "middle" },
        "No drain measured in this period"));
    }
    $("drain-box").replaceChildren(svg);
  }

  // 1, 2 or 5 times a power of ten, at least `rough`: grid steps people read at a glance.
  function niceTick(rough) {
    const power = 10 ** Math.floor(Math.log10(Math.max(rough, 1e-9)));
    return [1, 2, 5, 10].map((m) => m * power).find((t) => t >= rough);
  }

  // The current min and max written at the right end of their lines: where recording began
  // late in a long range the lines are short, and a label keeps them findable.
  function boundLabels(points, drawn, c, y, fmt) {
    const last = [...points].reverse().find((p) => typeof p.maxReplicas === "number");
    if (!last) return [];
    const keys = new Set(drawn.map((l) => l.key));
    // Above its line, so that a min of 0 stays inside the plot.
    const at = (v, text) => svgEl("text", {
      class: "bound-label", x: c.width - c.right - 4, y: fmt(y(v) - 4), "text-anchor": "end",
    }, text);
    if (last.minReplicas === last.maxReplicas) {
      return keys.has("maxReplicas") ? [at(last.maxReplicas, `min = max ${last.maxReplicas}`)] : [];
    }
    const labels = [];
    if (keys.has("maxReplicas")) labels.push(at(last.maxReplicas, `max ${last.maxReplicas}`));
    if (keys.has("minReplicas") && typeof last.minReplicas === "number") {
      labels.push(at(last.minReplicas, `min ${last.minReplicas}`));
    }
    return labels;
  }

  // A step line through the samples that have `key`, broken where a value is missing or the
  // samples are more than two steps apart (the Sentinel was not recording): no data is never
  // drawn as 0, nor bridged by a straight line.
  function linePath(points, key, step, to, x, y, fmt) {
    let d = "";
    let last = null;
    const close = () => {
      if (last) d += ` H${fmt(x(Math.min(last.ms + step, to)))}`;
    };
    for (const p of points) {
      const v = p[key];
      if (typeof v !== "number") {
        close();
        last = null;
        continue;
      }
      if (last && p.ms - last.ms > 2 * step) {
        close();
        last = null;
      }
      d += last ? ` H${fmt(x(p.ms))} V${fmt(y(v))}` : ` M${fmt(x(p.ms))} ${fmt(y(v))}`;
      last = p;
    }
    close();
    return d.trim();
  }

  // The chart in words, for screen readers.
  function chartSummary(points, missing) {
    if (!points.length) return "No samples in this period yet.";
    const parts = [];
    for (const line of LINES.slice().reverse()) {
      if (missing.has(line.key)) {
        parts.push(`${line.label}: not available`);
        continue;
      }
      const values = points.map((p) => p[line.key]).filter((v) => typeof v === "number");
      if (!values.length) continue;
      const lo = Math.min(...values);
      const hi = Math.max(...values);
      parts.push(lo === hi ? `${line.label}: ${lo}` : `${line.label}: from ${lo} to ${hi}`);
    }
    if (points.some((p) => p.paused === true)) parts.push("paused for part of the period");
    return `${parts.join("; ")}.`;
  }

  // ---- start -----------------------------------------------------------------------------

  function start() {
    $("token-form").addEventListener("submit", onTokenSubmit);
    $("forget-token").addEventListener("click", onForgetToken);
    $("history-close").addEventListener("click", closeHistory);
    $("history-range").addEventListener("change", () => loadHistory(true));
    $("history").addEventListener("close", onHistoryClosed);
    refreshWorkers();
    setInterval(() => {
      if (document.hidden || !$("token-panel").hidden) return;
      refreshWorkers();
      if (state.dialogWorker) loadHistory(false);
    }, REFRESH_MS);
  }

  start();
})();
