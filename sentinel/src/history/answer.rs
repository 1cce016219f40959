//! The JSON answer of `GET /v1/workers/{name}/history`: the series of one range, its tiles,
//! findings and decisions. A bucket without data is an absent point; a line with no source in
//! the whole range is named in `missing` (the page says so rather than drawing 0).

use super::decisions::Decision;
use super::findings::{findings, tiles, Finding, RangeTotals, Tiles};
use super::oscillation::{oscillation, WINDOW_MS};
use super::pre_warm_log::PreWarmSummary;
use super::range::HistoryRange;
use super::store::HistoryKept;
use super::tier::Bucket;
use super::worker_history::WorkerHistory;
use crate::config::file::{ScaledBy, WorkerConfig};
use crate::pool::cold_start::answer::ColdStartsAnswer;
use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryAnswer {
    pub worker: String,
    pub range: &'static str,
    pub from: String,
    pub to: String,
    pub step_seconds: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub sync_slots: u32,
    /// The Sentinel replica that answers (each replica records on its own).
    pub recorded_by: String,
    pub recording_since: Option<String>,
    pub missing: Vec<&'static str>,
    pub series: Vec<Point>,
    pub tiles: Tiles,
    pub findings: Vec<Finding>,
    pub decisions: Vec<DecisionEntry>,
    /// The workers' cold starts that began in the range.
    pub cold_starts: ColdStartsAnswer,
    /// What pre-warming from the schedule did in the range (filled in by the store).
    pub pre_warm: PreWarmSummary,
    /// Where this history lives, so the page can say what would lose it (filled in by the store).
    pub history_kept: HistoryKept,
    /// What scales the worker (filled in by the API, which knows the configuration).
    pub scaled_by: ScaledBy,
}

/// One bucket: the peak of each line within it; the range in effect at its end.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    pub t: String,
    pub wanted: u32,
    pub desired_replicas: u32,
    pub workers: Option<u32>,
    pub running: Option<u32>,
    pub waiting: Option<u32>,
    pub terminating: Option<u32>,
    pub backlog: u32,
    pub queued: u32,
    pub running_tasks: u32,
    /// The most task instances Airflow held in `scheduled` within the bucket.
    pub held_tasks: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Scaling was paused on purpose for some of the bucket.
    pub paused: bool,
    /// Task slots the backlog fell by per minute the pool ran (one decimal): a lower bound of
    /// its drain rate while work keeps arriving. `null` when nothing ran or it was not counted.
    pub drained_per_minute: Option<f64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionEntry {
    pub t: String,
    pub what: &'static str,
    pub from: u32,
    pub to: u32,
    pub queued: u32,
    pub running_tasks: u32,
    pub backlog: u32,
    pub sync_slots: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub formula: String,
    pub source: &'static str,
}

/// Reads one line of a bucket.
type LineOf = fn(&Bucket) -> Option<u32>;

/// The lines that come from the cluster side, by their JSON names.
const CLUSTER_LINES: [(&str, LineOf); 4] = [
    ("workers", |b| b.peak.workers.get()),
    ("running", |b| b.peak.running.get()),
    ("waiting", |b| b.peak.waiting.get()),
    ("terminating", |b| b.peak.terminating.get()),
];

/// What the answer says besides the recorded buckets.
pub struct AnswerContext<'a> {
    pub recorded_by: &'a str,
    pub cold_starts: ColdStartsAnswer,
    /// The last worker seen running with other slots than the pool's, when known.
    pub drifting_worker: Option<&'a str>,
}

/// The answer for `worker` over `range` ending at `now_ms`; `history` is `None` when nothing
/// has been recorded for it yet.
pub fn history_answer(
    worker: &WorkerConfig,
    history: Option<&WorkerHistory>,
    range: HistoryRange,
    now_ms: u64,
    context: AnswerContext<'_>,
) -> HistoryAnswer {
    let empty = WorkerHistory::default();
    let history = history.unwrap_or(&empty);
    let window = history.window(range, now_ms);
    let totals = RangeTotals::of(window.buckets.iter().copied());
    let missing = CLUSTER_LINES
        .iter()
        .filter(|(_, line)| window.buckets.iter().all(|b| line(b).is_none()))
        .map(|(name, _)| *name)
        .collect();
    HistoryAnswer {
        worker: worker.name.clone(),
        range: range.as_str(),
        from: rfc3339(window.from_ms),
        to: rfc3339(now_ms),
        step_seconds: window.tier.width_s,
        min_replicas: worker.min_replicas,
        max_replicas: worker.max_replicas,
        sync_slots: worker.sync_slots,
        recorded_by: context.recorded_by.to_string(),
        recording_since: history.recording_since_ms(now_ms).map(rfc3339),
        missing,
        series: window.buckets.iter().map(|b| point(b)).collect(),
        tiles: tiles(&totals),
        findings: findings(
            &totals,
            range,
            context.drifting_worker,
            oscillation(
                history
                    .decisions()
                    .since(window.from_ms.min(now_ms.saturating_sub(WINDOW_MS))),
            )
            .as_ref(),
        ),
        decisions: history
            .decisions()
            .since(window.from_ms)
            .map(decision_entry)
            .collect(),
        cold_starts: context.cold_starts,
        pre_warm: PreWarmSummary::default(),
        history_kept: HistoryKept::Memory,
        scaled_by: ScaledBy::Keda,
    }
}

fn point(b: &Bucket) -> Point {
    Point {
        t: rfc3339(u64::from(b.start_s) * 1000),
        wanted: b.peak.wanted,
        desired_replicas: b.peak.desired_replicas,
        workers: b.peak.workers.get(),
        running: b.peak.running.get(),
        waiting: b.peak.waiting.get(),
        terminating: b.peak.terminating.get(),
        backlog: b.peak.backlog,
        queued: b.peak.queued,
        running_tasks: b.peak.running_tasks,
        held_tasks: b.peak.held_tasks,
        min_replicas: b.min_replicas,
        max_replicas: b.max_replicas,
        paused: b.paused_ms > 0,
        drained_per_minute: drained_per_minute(b),
    }
}

fn drained_per_minute(b: &Bucket) -> Option<f64> {
    let drained = b.drained.get()?;
    (b.running_ms > 0)
        .then(|| (f64::from(drained) * 60_000.0 / f64::from(b.running_ms) * 10.0).round() / 10.0)
}

fn decision_entry(d: &Decision) -> DecisionEntry {
    DecisionEntry {
        t: rfc3339(d.at_ms),
        what: d.kind.as_str(),
        from: d.from,
        to: d.to,
        queued: d.queued,
        running_tasks: d.running_tasks,
        backlog: d.backlog,
        sync_slots: d.sync_slots,
        min_replicas: d.min_replicas,
        max_replicas: d.max_replicas,
        formula: d.formula(),
        source: d.source.as_str(),
    }
}

/// RFC 3339 in UTC, with sub-second digits only when there are any.
pub fn rfc3339(unix_ms: u64) -> String {
    let ms = i64::try_from(unix_ms).unwrap_or(i64::MAX);
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

#[cfg(test)]
mod tests {
    use super::super::decisions::DecisionSource;
    use super::super::sample::tests::{sample, with_cluster};
    use super::*;

    const NOW_MS: u64 = 1_800_000_000_000;

    fn worker() -> WorkerConfig {
        WorkerConfig {
            name: "astro-worker-default".into(),
            queues: vec!["default".into()],
            sync_slots: 4,
            min_replicas: 1,
            max_replicas: 5,
            overprovision_slots: 0,
        }
    }

    fn context(recorded_by: &str) -> AnswerContext<'_> {
        AnswerContext {
            recorded_by,
            cold_starts: ColdStartsAnswer::default(),
            drifting_worker: None,
        }
    }

    #[test]
    fn nothing_recorded_is_an_empty_answer_not_zeros() {
        let a = history_answer(
            &worker(),
            None,
            HistoryRange::OneDay,
            NOW_MS,
            context("sentinel-0"),
        );
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["series"], serde_json::json!([]));
        assert_eq!(json["recordingSince"], serde_json::Value::Null);
        assert_eq!(json["tiles"]["peakWanted"], serde_json::Value::Null);
        assert_eq!(json["findings"], serde_json::json!([]));
        assert_eq!(
            json["missing"],
            serde_json::json!(["workers", "running", "waiting", "terminating"])
        );
        assert_eq!(json["stepSeconds"], 60);
        assert_eq!(json["to"], "2027-01-15T08:00:00Z");
        assert_eq!(json["from"], "2027-01-14T08:01:00Z");
    }

    #[test]
    fn workers_see_sawing_over_a_steady_backlog_is_an_oscillation_finding_on_every_range() {
        let mut h = WorkerHistory::default();
        // Every 7 minutes the autoscaler moves between 2 and 3 workers; the backlog stays 7..9.
        for i in 0..8u64 {
            let (backlog, workers) = if i % 2 == 0 { (9, 3) } else { (7, 2) };
            let at = NOW_MS - (8 - i) * 7 * 60_000;
            h.record(
                at,
                &with_cluster(sample(backlog), workers, workers, 0),
                2000,
                DecisionSource::Postgres,
            );
        }
        for range in [HistoryRange::FifteenMinutes, HistoryRange::OneDay] {
            let a = history_answer(&worker(), Some(&h), range, NOW_MS, context("s"));
            let oscillation: Vec<&str> = a
                .findings
                .iter()
                .filter(|f| f.kind == super::super::findings::FindingKind::Oscillation)
                .map(|f| f.text.as_str())
                .collect();
            assert_eq!(
                oscillation,
                vec![
                    "Oscillated: 7 worker count changes within an hour, turning back 6 times, while \
                     the backlog stayed between 7 and 9 slots, within one worker's 4 slots."
                ],
                "{range:?}"
            );
        }
    }

    #[test]
    fn the_shape_the_page_reads() {
        let mut h = WorkerHistory::default();
        let api = DecisionSource::AirflowApi;
        h.record(NOW_MS - 120_000, &sample(8), 2000, api);
        // A gap of one minute, then pods show up.
        h.record(
            NOW_MS - 30_000,
            &with_cluster(sample(12), 2, 2, 0),
            2000,
            api,
        );
        h.record(
            NOW_MS - 28_000,
            &with_cluster(sample(12), 3, 2, 1),
            2000,
            api,
        );
        let a = history_answer(
            &worker(),
            Some(&h),
            HistoryRange::FifteenMinutes,
            NOW_MS,
            context("s-1"),
        );
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["worker"], "astro-worker-default");
        assert_eq!(json["range"], "15m");
        assert_eq!(json["stepSeconds"], 10);
        assert_eq!(json["recordedBy"], "s-1");
        assert_eq!(json["recordingSince"], "2027-01-15T07:58:00Z");
        assert_eq!(json["missing"], serde_json::json!([]));
        let series = json["series"].as_array().unwrap();
        assert_eq!(
            series.len(),
            2,
            "one point per bucket with data; the gap is absent"
        );
        assert_eq!(
            series[0],
            serde_json::json!({"t": "2027-01-15T07:58:00Z", "wanted": 2, "desiredReplicas": 2,
                "workers": null, "running": null, "waiting": null, "terminating": null,
                "backlog": 8, "queued": 4, "runningTasks": 4, "heldTasks": 0, "minReplicas": 1,
                "maxReplicas": 5, "paused": false, "drainedPerMinute": 0.0})
        );
        assert_eq!(series[1]["workers"], 3, "the peak within the bucket");
        assert_eq!(series[1]["waiting"], 1);
        assert_eq!(
            json["tiles"],
            serde_json::json!({"peakWanted": 3, "atMaximumSeconds": 0, "waitingForCapacitySeconds": 2,
                "pausedSeconds": 0, "heldBackSeconds": 0})
        );
        let decisions = json["decisions"].as_array().unwrap();
        assert_eq!(decisions.len(), 2);
        assert_eq!(
            decisions[0],
            serde_json::json!({"t": "2027-01-15T07:59:30Z", "what": "desiredReplicas", "from": 2,
                "to": 3, "queued": 6, "runningTasks": 6, "backlog": 12, "syncSlots": 4,
                "minReplicas": 1, "maxReplicas": 5, "formula": "ceil(12 / 4) = 3, held within 1..5",
                "source": "airflow-api"})
        );
        assert_eq!(decisions[1]["what"], "workers");
        assert_eq!(decisions[1]["source"], "kubernetes");
        assert_eq!(json["findings"][0]["kind"], "withinRange");
    }
}
