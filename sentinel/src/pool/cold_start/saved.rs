//! A finished cold start as the history file keeps it, so that a restarted Sentinel still shows
//! a pool's recent starts and still knows its measured lead (pre-warm's default).

use super::phase::{Mark, Phase};
use super::record::{ColdStart, Outcome, StartKind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedColdStart {
    worker: String,
    kind: StartKind,
    /// Followed without Kubernetes ([`Phase::AIRFLOW_ONLY`]).
    airflow_only: bool,
    marks: Vec<(Phase, Mark)>,
    outcome: Outcome,
}

impl SavedColdStart {
    /// The earliest moment of the start (what it is filed and bounded by).
    pub fn began_ms(&self) -> Option<u64> {
        self.marks.iter().map(|(_, m)| m.at_ms).min()
    }
}

impl From<&ColdStart> for SavedColdStart {
    fn from(start: &ColdStart) -> Self {
        SavedColdStart {
            worker: start.worker.clone(),
            kind: start.kind,
            airflow_only: start.chain == Phase::AIRFLOW_ONLY,
            marks: start.marks().collect(),
            outcome: start.outcome,
        }
    }
}

impl From<SavedColdStart> for ColdStart {
    fn from(saved: SavedColdStart) -> Self {
        let chain = if saved.airflow_only {
            Phase::AIRFLOW_ONLY
        } else {
            Phase::KUBERNETES
        };
        ColdStart::restored(saved.worker, saved.kind, chain, saved.marks, saved.outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::cold_start::record::Incomplete;

    #[test]
    fn a_start_comes_back_as_it_was_saved() {
        let mut start = ColdStart::new("w-1", StartKind::FromZero, Phase::AIRFLOW_ONLY);
        start.mark(Phase::BacklogSeen, Mark::sentinel(1_000));
        start.mark(Phase::AgentRegistered, Mark::airflow(2_500));
        start.outcome = Outcome::Incomplete(Incomplete::WorkerGone);
        let saved = SavedColdStart::from(&start);
        let bytes = postcard::to_stdvec(&saved).unwrap();
        let back: SavedColdStart = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.began_ms(), Some(1_000));
        assert_eq!(ColdStart::from(back), start);
    }
}
