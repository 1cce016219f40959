//! The schedule as last read: for each pre-warming worker, the DAG runs to come that will need
//! its slots, with what each is expected to need at its start.

use super::demand::Demand;
use std::collections::HashMap;
use std::time::SystemTime;

/// One DAG's next run, as one pool sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpcomingRun {
    pub dag: String,
    /// When the scheduler creates the run (`next_dagrun_run_after`).
    pub run_after: SystemTime,
    pub demand: Demand,
}

/// What one read of the schedule found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// By worker name; a worker without upcoming work is absent.
    pub runs: HashMap<String, Vec<UpcomingRun>>,
}

impl Plan {
    pub fn for_worker(&self, worker: &str) -> &[UpcomingRun] {
        self.runs.get(worker).map_or(&[], Vec::as_slice)
    }
}
