//! What pre-warming did, per worker: each window opened for a scheduled run ("pre-warmed 3
//! workers at 04:58:30 for etl_daily (runs at 05:00; last 5 runs needed 6 slots at start)")
//! and how it ended, with the worker-time it kept idle. Bounded per worker, and saved with the
//! history file ([`SavedPreWarmEntry`]) where there is one.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// At most this many entries per worker.
pub const MAX_PRE_WARM_ENTRIES: usize = 200;

/// Saved with the history by the variant's position: new variants go last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PreWarmOutcome {
    /// The window opened: the answer carries the expected slots from now.
    Opened,
    /// The run's work reached the pool's queues: the real backlog took over.
    WorkArrived,
    /// No work came within the timeout after `run_after`.
    TimedOut,
    /// The run is no longer scheduled (DAG paused, schedule changed) before it came.
    Dropped,
}

/// One entry of the log, as the history answer shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreWarmEntry {
    pub t: String,
    #[serde(skip)]
    pub at_ms: u64,
    pub outcome: PreWarmOutcome,
    pub dag: String,
    pub run_after: String,
    pub expected_slots: u64,
    pub workers: u32,
    /// Worker-seconds the pool's workers stood idle in the window (ended windows only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_worker_seconds: Option<f64>,
    pub text: String,
}

/// An entry as the history file keeps it: every field, none skipped (postcard, the file's
/// format, reads fields by position).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedPreWarmEntry {
    t: String,
    at_ms: u64,
    outcome: PreWarmOutcome,
    dag: String,
    run_after: String,
    expected_slots: u64,
    workers: u32,
    idle_worker_seconds: Option<f64>,
    text: String,
}

impl SavedPreWarmEntry {
    pub fn at_ms(&self) -> u64 {
        self.at_ms
    }
}

impl From<&PreWarmEntry> for SavedPreWarmEntry {
    fn from(e: &PreWarmEntry) -> Self {
        SavedPreWarmEntry {
            t: e.t.clone(),
            at_ms: e.at_ms,
            outcome: e.outcome,
            dag: e.dag.clone(),
            run_after: e.run_after.clone(),
            expected_slots: e.expected_slots,
            workers: e.workers,
            idle_worker_seconds: e.idle_worker_seconds,
            text: e.text.clone(),
        }
    }
}

impl From<SavedPreWarmEntry> for PreWarmEntry {
    fn from(e: SavedPreWarmEntry) -> Self {
        PreWarmEntry {
            t: e.t,
            at_ms: e.at_ms,
            outcome: e.outcome,
            dag: e.dag,
            run_after: e.run_after,
            expected_slots: e.expected_slots,
            workers: e.workers,
            idle_worker_seconds: e.idle_worker_seconds,
            text: e.text,
        }
    }
}

#[derive(Default)]
pub struct PreWarmLog {
    entries: Mutex<HashMap<String, VecDeque<PreWarmEntry>>>,
}

/// What the history answer says of pre-warming over a range.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreWarmSummary {
    pub entries: Vec<PreWarmEntry>,
    /// Idle worker-seconds of the windows that ended in the range.
    pub idle_worker_seconds: f64,
    /// Of which in windows whose run queued no work on the pool (timed out or dropped).
    pub unused_worker_seconds: f64,
}

impl PreWarmLog {
    pub fn push(&self, worker: &str, entry: PreWarmEntry) {
        tracing::info!(worker, dag = %entry.dag, outcome = ?entry.outcome, "{}", entry.text);
        let mut all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let log = all.entry(worker.to_owned()).or_default();
        log.push_back(entry);
        while log.len() > MAX_PRE_WARM_ENTRIES {
            log.pop_front();
        }
    }

    /// Every worker's entries, oldest first, to save with the history.
    pub fn saved(&self) -> BTreeMap<String, Vec<SavedPreWarmEntry>> {
        let all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        all.iter()
            .filter(|(_, log)| !log.is_empty())
            .map(|(w, log)| (w.clone(), log.iter().map(SavedPreWarmEntry::from).collect()))
            .collect()
    }

    /// Puts entries saved by an earlier Sentinel ahead of this one's, those before this one's
    /// first (at most [`MAX_PRE_WARM_ENTRIES`] a worker, the latest).
    pub fn restore(&self, saved: BTreeMap<String, Vec<SavedPreWarmEntry>>) {
        let mut all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for (worker, entries) in saved {
            let log = all.entry(worker).or_default();
            // What this Sentinel logged itself from some moment on stands: the saved entries
            // of that time (another replica's, on a take-over) would repeat it.
            let own_from = log.front().map_or(u64::MAX, |e| e.at_ms);
            let mut restored: VecDeque<PreWarmEntry> = entries
                .into_iter()
                .filter(|e| e.at_ms() < own_from)
                .map(PreWarmEntry::from)
                .collect();
            restored.extend(log.drain(..));
            while restored.len() > MAX_PRE_WARM_ENTRIES {
                restored.pop_front();
            }
            *log = restored;
        }
    }

    /// The entries of `worker` since `from_ms`, and the idle time they account for.
    pub fn summary(&self, worker: &str, from_ms: u64) -> PreWarmSummary {
        let all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entries: Vec<PreWarmEntry> = all
            .get(worker)
            .map(|log| log.iter().filter(|e| e.at_ms >= from_ms).cloned().collect())
            .unwrap_or_default();
        let idle = |unused_only: bool| {
            entries
                .iter()
                .filter(|e| {
                    !unused_only
                        || matches!(
                            e.outcome,
                            PreWarmOutcome::TimedOut | PreWarmOutcome::Dropped
                        )
                })
                .filter_map(|e| e.idle_worker_seconds)
                // Not `sum`: an empty f64 sum is -0.0, which JSON would carry as `-0.0`.
                .fold(0.0, |total, s| total + s)
        };
        PreWarmSummary {
            idle_worker_seconds: idle(false),
            unused_worker_seconds: idle(true),
            entries,
        }
    }
}

impl PreWarmSummary {
    /// The finding: idle worker-time spent on pre-warming, and how much of it no work used.
    pub fn finding_text(&self) -> Option<String> {
        if self.idle_worker_seconds <= 0.0 {
            return None;
        }
        Some(format!(
            "Pre-warming kept workers idle for {:.0} worker-seconds before their runs' work arrived; {:.0} of them for runs that brought no work to this pool.",
            self.idle_worker_seconds, self.unused_worker_seconds
        ))
    }
}

pub fn ms_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
