//! The decision log: every change of what the Sentinel asks for (`desiredReplicas`) and of the
//! count the autoscaler set (`workers`), with the inputs behind it.
//!
//! A change of `wanted` alone, while `desiredReplicas` is held at the minimum or maximum,
//! changes nothing KEDA does; it shows in the series, not here. The first value seen (and the
//! first `workers` value once the cluster side reports it) is a starting point, not a change.
//! A gap does not reset the last values: a change across a gap is still logged.

use super::sample::Sample;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// At most this many entries per worker...
pub const MAX_DECISIONS: usize = 1000;
/// ...and none older than this.
pub const DECISION_RETENTION_MS: u64 = 14 * 86_400_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecisionKind {
    DesiredReplicas,
    Workers,
}

impl DecisionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::DesiredReplicas => "desiredReplicas",
            DecisionKind::Workers => "workers",
        }
    }
}

/// Where the changed number came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecisionSource {
    AirflowApi,
    Postgres,
    Kubernetes,
}

impl DecisionSource {
    /// The source behind `desiredReplicas`, from the backlog source's kind.
    pub fn for_backlog(kind: &str) -> DecisionSource {
        // The Sentinel has two backlog sources; anything else reads Airflow's API.
        if kind == "postgres" {
            DecisionSource::Postgres
        } else {
            DecisionSource::AirflowApi
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionSource::AirflowApi => "airflow-api",
            DecisionSource::Postgres => "postgres",
            DecisionSource::Kubernetes => "kubernetes",
        }
    }
}

/// One change. The formula text is built when asked, not stored: 48 bytes an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub at_ms: u64,
    pub kind: DecisionKind,
    pub source: DecisionSource,
    pub from: u32,
    pub to: u32,
    pub queued: u32,
    pub running_tasks: u32,
    pub backlog: u32,
    pub sync_slots: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
}

impl Decision {
    /// `ceil(12 / 4) = 3, held within 1..5` (and `at 5` when holding changed the result).
    pub fn formula(&self) -> String {
        let wanted = u64::from(self.backlog).div_ceil(u64::from(self.sync_slots.max(1)));
        let held = wanted.clamp(
            u64::from(self.min_replicas),
            u64::from(self.max_replicas.max(self.min_replicas)),
        );
        let mut text = format!(
            "ceil({} / {}) = {wanted}, held within {}..{}",
            self.backlog, self.sync_slots, self.min_replicas, self.max_replicas
        );
        if held != wanted {
            text.push_str(&format!(" at {held}"));
        }
        text
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionLog {
    entries: VecDeque<Decision>,
    last_desired: Option<u32>,
    last_workers: Option<u32>,
}

impl DecisionLog {
    /// Logs what changed between the last sample and `sample`, taken at `at_ms`.
    pub fn observe(&mut self, at_ms: u64, sample: &Sample, backlog_source: DecisionSource) {
        let entry = |kind, source, from, to| Decision {
            at_ms,
            kind,
            source,
            from,
            to,
            queued: sample.queued,
            running_tasks: sample.running_tasks,
            backlog: sample.backlog,
            sync_slots: sample.sync_slots,
            min_replicas: sample.min_replicas,
            max_replicas: sample.max_replicas,
        };
        if let Some(from) = self.last_desired.filter(|d| *d != sample.desired_replicas) {
            self.push(entry(
                DecisionKind::DesiredReplicas,
                backlog_source,
                from,
                sample.desired_replicas,
            ));
        }
        self.last_desired = Some(sample.desired_replicas);
        if let Some(to) = sample.cluster.workers {
            if let Some(from) = self.last_workers.filter(|w| *w != to) {
                self.push(entry(
                    DecisionKind::Workers,
                    DecisionSource::Kubernetes,
                    from,
                    to,
                ));
            }
            self.last_workers = Some(to);
        }
        self.forget_before(at_ms.saturating_sub(DECISION_RETENTION_MS));
    }

    fn push(&mut self, decision: Decision) {
        // Entries stay in time order: any dated after this one came from a clock that ran ahead.
        self.drop_after(decision.at_ms);
        if self.entries.len() == MAX_DECISIONS {
            self.entries.pop_front();
        }
        // One allocation of the full size: the bound is what is reserved.
        if self.entries.capacity() < MAX_DECISIONS {
            self.entries
                .reserve_exact(MAX_DECISIONS - self.entries.len());
        }
        self.entries.push_back(decision);
    }

    fn forget_before(&mut self, cutoff_ms: u64) {
        while self.entries.front().is_some_and(|d| d.at_ms < cutoff_ms) {
            self.entries.pop_front();
        }
    }

    /// Drops the entries dated after `last_ms`; returns how many.
    pub fn drop_after(&mut self, last_ms: u64) -> usize {
        let kept = self.entries.partition_point(|d| d.at_ms <= last_ms);
        let dropped = self.entries.len() - kept;
        self.entries.truncate(kept);
        dropped
    }

    /// Entries at or after `from_ms`, oldest first.
    pub fn since(&self, from_ms: u64) -> impl Iterator<Item = &Decision> {
        let first = self.entries.partition_point(|d| d.at_ms < from_ms);
        self.entries.range(first..)
    }

    /// Whether a log read from disk keeps the bounds.
    pub fn fits(&self) -> bool {
        self.entries.len() <= MAX_DECISIONS
    }
}

#[cfg(test)]
mod tests {
    use super::super::sample::tests::{sample, with_cluster};
    use super::*;

    const API: DecisionSource = DecisionSource::AirflowApi;

    #[test]
    fn logs_changes_of_desired_and_workers_with_their_inputs() {
        let mut log = DecisionLog::default();
        log.observe(1_000, &sample(4), API);
        assert_eq!(log.since(0).count(), 0, "the first value is not a change");
        log.observe(2_000, &sample(12), API);
        log.observe(3_000, &sample(12), API);
        let d: Vec<_> = log.since(0).copied().collect();
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].kind, d[0].from, d[0].to, d[0].at_ms),
            (DecisionKind::DesiredReplicas, 1, 3, 2_000)
        );
        assert_eq!((d[0].queued, d[0].running_tasks, d[0].backlog), (6, 6, 12));
        assert_eq!(d[0].formula(), "ceil(12 / 4) = 3, held within 1..5");
        assert_eq!(d[0].source.as_str(), "airflow-api");

        // Pods appear: a starting point. Then the autoscaler moves.
        log.observe(4_000, &with_cluster(sample(12), 1, 1, 0), API);
        log.observe(5_000, &with_cluster(sample(12), 3, 1, 0), API);
        let last = *log.since(0).last().unwrap();
        assert_eq!(
            (last.kind, last.from, last.to, last.source),
            (DecisionKind::Workers, 1, 3, DecisionSource::Kubernetes)
        );
        assert_eq!(log.since(0).count(), 2);
        assert_eq!(log.since(5_000).count(), 1);
    }

    #[test]
    fn wanted_moving_while_held_is_not_a_decision() {
        let mut log = DecisionLog::default();
        log.observe(0, &sample(40), API);
        log.observe(1, &sample(80), API);
        assert_eq!(log.since(0).count(), 0, "held at 5 both times");
        log.observe(2, &sample(0), API);
        assert_eq!(
            log.since(0).next().unwrap().formula(),
            "ceil(0 / 4) = 0, held within 1..5 at 1"
        );
    }

    #[test]
    fn bounded_by_count_and_age() {
        let mut log = DecisionLog::default();
        for i in 0..(MAX_DECISIONS as u64 + 10) {
            log.observe(i, &sample(if i % 2 == 0 { 4 } else { 12 }), API);
        }
        assert_eq!(log.since(0).count(), MAX_DECISIONS);
        // Changes at 1..=1009: the oldest 9 dropped.
        assert_eq!(log.since(0).next().unwrap().at_ms, 10);
        assert_eq!(log.entries.capacity(), MAX_DECISIONS);
        log.observe(11 + DECISION_RETENTION_MS + 1, &sample(4), API);
        assert_eq!(
            log.since(0).count(),
            MAX_DECISIONS - 1,
            "one more entry came in; those at 10 and 11 are past 14 days"
        );
    }

    #[test]
    fn source_names() {
        assert_eq!(DecisionSource::for_backlog("postgres").as_str(), "postgres");
        assert_eq!(
            DecisionSource::for_backlog("airflow-api").as_str(),
            "airflow-api"
        );
    }
}
