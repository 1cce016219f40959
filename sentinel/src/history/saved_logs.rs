//! What the history file keeps besides the tiers and decisions: each pool's recent cold starts
//! (what the page shows of them, and the measured lead pre-warm defaults to) and each worker's
//! pre-warm log.

use super::pre_warm_log::SavedPreWarmEntry;
use crate::pool::cold_start::saved::SavedColdStart;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedLogs {
    pub cold_starts: BTreeMap<String, Vec<SavedColdStart>>,
    pub pre_warm: BTreeMap<String, Vec<SavedPreWarmEntry>>,
}

impl SavedLogs {
    /// Keeps the workers `keep` names, without what is dated after `latest_ms`; returns how
    /// many entries that dropped for their date.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool, latest_ms: u64) -> usize {
        self.cold_starts.retain(|w, _| keep(w));
        self.pre_warm.retain(|w, _| keep(w));
        let mut dropped = 0;
        for starts in self.cold_starts.values_mut() {
            let before = starts.len();
            starts.retain(|s| s.began_ms().is_some_and(|b| b <= latest_ms));
            dropped += before - starts.len();
        }
        for entries in self.pre_warm.values_mut() {
            let before = entries.len();
            entries.retain(|e| e.at_ms() <= latest_ms);
            dropped += before - entries.len();
        }
        dropped
    }
}

/// A worker's completed cold start from zero (4 s) and an opened pre-warm window, both at
/// `at_ms`, as the logs hold them.
#[cfg(test)]
pub fn example(worker: &str, at_ms: u64) -> SavedLogs {
    use crate::history::pre_warm_log::{PreWarmEntry, PreWarmOutcome};
    use crate::pool::cold_start::phase::{Mark, Phase};
    use crate::pool::cold_start::record::{ColdStart, Outcome, StartKind};
    let mut start = ColdStart::new(
        &format!("{worker}-abc"),
        StartKind::FromZero,
        Phase::KUBERNETES,
    );
    start.mark(Phase::BacklogSeen, Mark::sentinel(at_ms));
    start.mark(Phase::FirstTaskRunning, Mark::airflow(at_ms + 4_000));
    start.outcome = Outcome::Complete;
    let entry = PreWarmEntry {
        t: "2027-01-15T08:00:00Z".into(),
        at_ms,
        outcome: PreWarmOutcome::Opened,
        dag: "etl".into(),
        run_after: "2027-01-15T08:00:30Z".into(),
        expected_slots: 6,
        workers: 2,
        idle_worker_seconds: Some(12.5),
        text: "pre-warmed 2 workers".into(),
    };
    SavedLogs {
        cold_starts: BTreeMap::from([(worker.to_string(), vec![(&start).into()])]),
        pre_warm: BTreeMap::from([(worker.to_string(), vec![(&entry).into()])]),
    }
}
