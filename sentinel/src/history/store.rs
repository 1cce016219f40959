//! The history of every worker, shared by the refresh loop (the one writer, once per refresh)
//! and the API (readers). The lock is held only to add one refresh or to build one answer.

use super::answer::{history_answer, AnswerContext, HistoryAnswer};
use super::clock::{unix_ms, WallClock};
use super::decisions::DecisionSource;
use super::findings::{Finding, FindingKind};
use super::pre_warm_log::PreWarmLog;
use super::range::HistoryRange;
use super::sample::Sample;
use super::saved_logs::SavedLogs;
use super::worker_history::WorkerHistory;
use crate::config::file::WorkerConfig;
use crate::pool::cold_start::answer::cold_starts_answer;
use crate::pool::ColdStarts;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// What is kept (and saved): each worker's history by worker name, and the logs a loaded file
/// brought (handed to the cold starts and the pre-warm log when the history is built; what is
/// saved is read from those, live).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryData {
    pub workers: BTreeMap<String, WorkerHistory>,
    pub logs: SavedLogs,
}

/// Where the history lives, and so what loses it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HistoryKept {
    /// No `history.path`: lost when the Sentinel restarts.
    #[default]
    Memory,
    /// A file in the Pod's own volume (`history.volatile`): lost when the Pod goes.
    Pod,
    /// A file on a volume that outlives the Pod.
    Volume,
}

impl HistoryKept {
    pub fn of(config: &crate::config::file::HistoryConfig) -> HistoryKept {
        match (&config.path, config.volatile) {
            (None, _) => HistoryKept::Memory,
            (Some(_), true) => HistoryKept::Pod,
            (Some(_), false) => HistoryKept::Volume,
        }
    }
}

pub struct History {
    data: Mutex<HistoryData>,
    kept: HistoryKept,
    clock: Arc<dyn WallClock>,
    recorded_by: String,
    /// The pools' cold starts (saved with the history).
    cold_starts: Option<Arc<ColdStarts>>,
    pre_warm: Arc<PreWarmLog>,
    /// Per worker pool, the last of its workers seen running with other slots than the pool's
    /// (in memory only: the finding names it while this Sentinel has seen it).
    drifting_workers: Mutex<HashMap<String, String>>,
}

impl History {
    /// `recorded_by` names this replica in every answer; `data` is what was loaded, if any.
    pub fn new(clock: Arc<dyn WallClock>, recorded_by: String, mut data: HistoryData) -> History {
        let pre_warm = Arc::new(PreWarmLog::default());
        pre_warm.restore(std::mem::take(&mut data.logs.pre_warm));
        History {
            data: Mutex::new(data),
            clock,
            recorded_by,
            kept: HistoryKept::Memory,
            cold_starts: None,
            pre_warm,
            drifting_workers: Mutex::default(),
        }
    }

    /// Answers and records cold starts with `cold_starts` as well (given the ones loaded).
    pub fn with_cold_starts(mut self, cold_starts: Arc<ColdStarts>) -> History {
        cold_starts.restore(std::mem::take(&mut self.lock().logs.cold_starts));
        self.cold_starts = Some(cold_starts);
        self
    }

    /// The logs to save with the history, as they are now.
    pub fn saved_logs(&self) -> SavedLogs {
        SavedLogs {
            cold_starts: self
                .cold_starts
                .as_ref()
                .map(|c| c.saved())
                .unwrap_or_default(),
            pre_warm: self.pre_warm.saved(),
        }
    }

    /// Says where the history lives in every answer.
    pub fn kept_in(mut self, kept: HistoryKept) -> History {
        self.kept = kept;
        self
    }

    pub fn cold_starts(&self) -> Option<&Arc<ColdStarts>> {
        self.cold_starts.as_ref()
    }

    /// Where pre-warming writes what it did.
    pub fn pre_warm_log(&self) -> Arc<PreWarmLog> {
        self.pre_warm.clone()
    }

    pub fn now_ms(&self) -> u64 {
        unix_ms(self.clock.now())
    }

    /// Adds one refresh: a sample for every worker whose data was available, each standing
    /// for `weight_ms`. Workers left out have a gap here.
    pub fn record<'a>(
        &self,
        at_ms: u64,
        samples: impl IntoIterator<Item = (&'a str, Sample)>,
        weight_ms: u32,
        backlog_source: DecisionSource,
    ) {
        let mut data = self.lock();
        for (worker, sample) in samples {
            // Looked up before inserting: a name is allocated once per worker, not per refresh.
            match data.workers.get_mut(worker) {
                Some(history) => history.record(at_ms, &sample, weight_ms, backlog_source),
                None => {
                    let mut history = WorkerHistory::default();
                    history.record(at_ms, &sample, weight_ms, backlog_source);
                    data.workers.insert(worker.to_string(), history);
                }
            }
        }
    }

    /// The answer for `worker` over `range`, ending now.
    /// Remembers `drifting` as the pool's last worker seen with other slots than the pool's.
    pub fn note_drifting_worker(&self, pool: &str, drifting: &str) {
        let mut names = self
            .drifting_workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if names.get(pool).map(String::as_str) != Some(drifting) {
            names.insert(pool.to_string(), drifting.to_string());
        }
    }

    pub fn answer(&self, worker: &WorkerConfig, range: HistoryRange) -> HistoryAnswer {
        let now_ms = self.now_ms();
        let from_ms = now_ms.saturating_sub(range.millis());
        let cold_starts = self
            .cold_starts
            .as_ref()
            .map(|c| cold_starts_answer(&c.starts_since(&worker.name, from_ms), c.chain()))
            .unwrap_or_default();
        let drifting_worker = self
            .drifting_workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&worker.name)
            .cloned();
        let data = self.lock();
        let mut answer = history_answer(
            worker,
            data.workers.get(&worker.name),
            range,
            now_ms,
            AnswerContext {
                recorded_by: &self.recorded_by,
                cold_starts,
                drifting_worker: drifting_worker.as_deref(),
            },
        );
        let pre_warm = self
            .pre_warm
            .summary(&worker.name, now_ms.saturating_sub(range.millis()));
        if let Some(text) = pre_warm.finding_text() {
            answer.findings.push(Finding {
                kind: FindingKind::PreWarmIdle,
                text,
                seconds: pre_warm.idle_worker_seconds.round() as u64,
            });
        }
        answer.pre_warm = pre_warm;
        answer.history_kept = self.kept;
        answer
    }

    /// Continues `saved`: a replica that takes the history file over from another continues
    /// the file's record of each worker (the writer's, the fuller one); workers the file does
    /// not know keep what this replica recorded.
    pub fn continue_from(&self, saved: HistoryData) {
        self.lock().workers.extend(saved.workers);
        self.pre_warm.restore(saved.logs.pre_warm);
        if let Some(cold_starts) = &self.cold_starts {
            cold_starts.restore(saved.logs.cold_starts);
        }
    }

    /// Runs `f` on the data under the lock (to serialise it for saving).
    pub fn with_data<R>(&self, f: impl FnOnce(&HistoryData) -> R) -> R {
        f(&self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, HistoryData> {
        // A panic while recording leaves at worst one half-added sample: keep serving.
        self.data
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::clock::SystemClock;
    use crate::history::saved_logs::example;
    use std::time::Duration;

    const POOL: &str = "astro-worker-default";
    const T0_MS: u64 = 1_800_000_000_000;

    fn loaded() -> HistoryData {
        HistoryData {
            logs: example(POOL, T0_MS),
            ..HistoryData::default()
        }
    }

    #[test]
    fn loaded_logs_reach_the_cold_starts_and_the_pre_warm_log_and_are_saved_again() {
        let cold_starts = Arc::new(ColdStarts::new([POOL.to_string()], true, None));
        let history = History::new(Arc::new(SystemClock), "r".into(), loaded())
            .with_cold_starts(cold_starts.clone());
        // The measured lead pre-warm defaults to survives the restart.
        assert_eq!(
            cold_starts.typical_cold_start(POOL),
            Some(Duration::from_secs(4))
        );
        assert_eq!(history.pre_warm_log().summary(POOL, 0).entries.len(), 1);
        assert_eq!(history.saved_logs(), example(POOL, T0_MS));
        // Handed over, not kept twice.
        assert_eq!(history.with_data(|d| d.logs.clone()), SavedLogs::default());
    }

    #[test]
    fn a_take_over_adds_the_files_logs_before_this_replicas_own() {
        let cold_starts = Arc::new(ColdStarts::new([POOL.to_string()], true, None));
        let own = History::new(
            Arc::new(SystemClock),
            "r".into(),
            HistoryData {
                logs: example(POOL, T0_MS + 60_000),
                ..HistoryData::default()
            },
        )
        .with_cold_starts(cold_starts);
        // The file: one entry before this replica's first, one at the same time (the same
        // window, seen by the other replica).
        let mut file = loaded();
        let same_time = example(POOL, T0_MS + 60_000);
        for (w, e) in same_time.pre_warm {
            file.logs.pre_warm.get_mut(&w).unwrap().extend(e);
        }
        own.continue_from(file);
        let ms: Vec<u64> = own
            .pre_warm_log()
            .summary(POOL, 0)
            .entries
            .iter()
            .map(|e| e.at_ms)
            .collect();
        assert_eq!(ms, vec![T0_MS, T0_MS + 60_000]);
        assert_eq!(own.saved_logs().cold_starts[POOL].len(), 2);
    }
}
