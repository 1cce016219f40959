//! One worker's cold start: the moments of the phases it went through, and how it ended.
//!
//! The enums here and in [`phase`](super::phase) are saved with the history by their variant's
//! position: new variants go last.

use super::phase::{Mark, Phase};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Whether the pool had no worker at all when the start began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartKind {
    /// The pool was at zero: this start is all the latency its first task sees.
    FromZero,
    /// Another worker joining a pool that already had some.
    Additional,
}

impl StartKind {
    pub fn json_name(self) -> &'static str {
        match self {
            StartKind::FromZero => "fromZero",
            StartKind::Additional => "additional",
        }
    }

    /// The `start` label of the total histogram.
    pub fn label(self) -> &'static str {
        match self {
            StartKind::FromZero => "from_zero",
            StartKind::Additional => "additional",
        }
    }
}

/// Why a start ended before its first task ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Incomplete {
    /// The Pod was deleted first (scaled in, evicted, the start failed).
    PodDeleted,
    /// Outside Kubernetes: the worker left Airflow's list of online workers first.
    WorkerGone,
    /// No first task within [`OPEN_LIMIT`](super::tracker::OPEN_LIMIT) of the start.
    TimedOut,
}

impl Incomplete {
    pub fn json_name(self) -> &'static str {
        match self {
            Incomplete::PodDeleted => "podDeleted",
            Incomplete::WorkerGone => "workerGone",
            Incomplete::TimedOut => "timedOut",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    InProgress,
    /// The first task ran.
    Complete,
    Incomplete(Incomplete),
}

/// A segment between two consecutive phases that were both seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub from: Phase,
    pub to: Phase,
    pub duration: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdStart {
    /// The Pod's name, which is also the worker's name in Airflow and the hostname of its
    /// task instances (the chart sets all three alike).
    pub worker: String,
    pub kind: StartKind,
    /// The phases this kind of Sentinel follows ([`Phase::KUBERNETES`] or
    /// [`Phase::AIRFLOW_ONLY`]).
    pub chain: &'static [Phase],
    marks: BTreeMap<Phase, Mark>,
    pub outcome: Outcome,
}

impl ColdStart {
    pub fn new(worker: &str, kind: StartKind, chain: &'static [Phase]) -> ColdStart {
        ColdStart {
            worker: worker.to_string(),
            kind,
            chain,
            marks: BTreeMap::new(),
            outcome: Outcome::InProgress,
        }
    }

    /// A start as saved: `marks` as they were, `outcome` how it ended.
    pub fn restored(
        worker: String,
        kind: StartKind,
        chain: &'static [Phase],
        marks: impl IntoIterator<Item = (Phase, Mark)>,
        outcome: Outcome,
    ) -> ColdStart {
        ColdStart {
            worker,
            kind,
            chain,
            marks: marks.into_iter().collect(),
            outcome,
        }
    }

    /// Records `phase` unless it is already known: the first sighting is the moment.
    pub fn mark(&mut self, phase: Phase, mark: Mark) {
        self.marks.entry(phase).or_insert(mark);
    }

    pub fn has(&self, phase: Phase) -> bool {
        self.marks.contains_key(&phase)
    }

    pub fn marks(&self) -> impl Iterator<Item = (Phase, Mark)> + '_ {
        self.marks.iter().map(|(p, m)| (*p, *m))
    }

    /// The earliest moment known of this start (what it is filed under).
    pub fn began_ms(&self) -> Option<u64> {
        self.marks.values().map(|m| m.at_ms).min()
    }

    pub fn is_open(&self) -> bool {
        self.outcome == Outcome::InProgress
    }

    /// The time between each two consecutive phases of the chain that were both seen. A
    /// phase dated before its predecessor (two clocks, or a 1-second Kubernetes timestamp next
    /// to a sub-second one) counts 0 rather than a negative time.
    pub fn segments(&self) -> Vec<Segment> {
        self.chain
            .windows(2)
            .filter_map(|pair| {
                let (from, to) = (self.marks.get(&pair[0])?, self.marks.get(&pair[1])?);
                Some(Segment {
                    from: pair[0],
                    to: pair[1],
                    duration: Duration::from_millis(to.at_ms.saturating_sub(from.at_ms)),
                })
            })
            .collect()
    }

    /// Backlog seen → first task running, when both were seen.
    pub fn total(&self) -> Option<Duration> {
        let from = self.marks.get(&Phase::BacklogSeen)?;
        let to = self.marks.get(&Phase::FirstTaskRunning)?;
        Some(Duration::from_millis(to.at_ms.saturating_sub(from.at_ms)))
    }
}

/// The nearest-rank `q` quantile (0 < q ≤ 1) of `values`; `None` when there are none.
pub fn nearest_rank(values: &mut [Duration], q: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = (q * values.len() as f64).ceil().max(1.0) as usize;
    Some(values[rank.min(values.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_join_consecutive_seen_phases_and_never_go_negative() {
        let mut s = ColdStart::new("w-1", StartKind::FromZero, Phase::KUBERNETES);
        s.mark(Phase::BacklogSeen, Mark::sentinel(1_000));
        s.mark(Phase::ReplicasRaised, Mark::sentinel(1_400));
        s.mark(Phase::PodScheduled, Mark::sentinel(1_500));
        // Container started unknown: scheduled → registered is no segment of its own.
        s.mark(Phase::AgentRegistered, Mark::airflow(3_000));
        s.mark(Phase::FirstTaskRunning, Mark::airflow(2_900));
        s.mark(Phase::BacklogSeen, Mark::sentinel(5)); // a later sighting changes nothing
        let got: Vec<(Phase, u64)> = s
            .segments()
            .iter()
            .map(|g| (g.to, g.duration.as_millis() as u64))
            .collect();
        assert_eq!(
            got,
            vec![
                (Phase::ReplicasRaised, 400),
                (Phase::PodScheduled, 100),
                (Phase::FirstTaskRunning, 0)
            ]
        );
        assert_eq!(s.total(), Some(Duration::from_millis(1_900)));
        assert_eq!(s.began_ms(), Some(1_000));
    }

    #[test]
    fn nearest_rank_quantiles() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        assert_eq!(nearest_rank(&mut [], 0.9), None);
        assert_eq!(
            nearest_rank(&mut ms(&[5]), 0.9),
            Some(Duration::from_millis(5))
        );
        let mut ten = ms(&[10, 1, 9, 2, 8, 3, 7, 4, 6, 5]);
        assert_eq!(nearest_rank(&mut ten, 0.5), Some(Duration::from_millis(5)));
        assert_eq!(nearest_rank(&mut ten, 0.9), Some(Duration::from_millis(9)));
    }
}
