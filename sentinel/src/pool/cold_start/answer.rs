//! The cold starts of one worker pool as the history API answers them (`coldStarts` in
//! `GET /v1/workers/{name}/history`): each start's phases with their moments and where each
//! moment comes from, the time between consecutive phases, and the p50/p90 of the totals.

use super::phase::Seen;
use super::record::{nearest_rank, ColdStart, Outcome};
use crate::history::answer::rfc3339;
use serde::Serialize;

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ColdStartsAnswer {
    /// Oldest first.
    pub starts: Vec<ColdStartEntry>,
    /// Over the complete starts listed (absent figures while there are none).
    pub total_p50_ms: Option<u64>,
    pub total_p90_ms: Option<u64>,
    /// The phases this Sentinel can see, in order (outside Kubernetes, Airflow's only).
    pub phases: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ColdStartEntry {
    /// The Pod's (and the Airflow worker's) name.
    pub worker: String,
    /// `fromZero` or `additional`.
    pub kind: &'static str,
    /// `complete`, `incomplete` or `inProgress`.
    pub outcome: &'static str,
    /// Why an incomplete start ended: `podDeleted`, `workerGone`, `timedOut`.
    pub ended_by: Option<&'static str>,
    /// The phases seen, in order; a phase not seen is absent (never 0).
    pub phases: Vec<PhaseEntry>,
    /// The time between consecutive phases both seen.
    pub durations: Vec<DurationEntry>,
    /// Backlog seen → first task running.
    pub total_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseEntry {
    pub phase: &'static str,
    pub at: String,
    /// `sentinel` (its own observation), `kubernetes` (an object's 1-second timestamp) or
    /// `airflow` (Airflow's own record).
    pub seen: Seen,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DurationEntry {
    pub from: &'static str,
    pub to: &'static str,
    pub ms: u64,
}

pub fn cold_starts_answer(starts: &[ColdStart], chain: &[super::phase::Phase]) -> ColdStartsAnswer {
    let mut totals: Vec<_> = starts
        .iter()
        .filter(|s| s.outcome == Outcome::Complete)
        .filter_map(ColdStart::total)
        .collect();
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    ColdStartsAnswer {
        total_p50_ms: nearest_rank(&mut totals, 0.5).map(ms),
        total_p90_ms: nearest_rank(&mut totals, 0.9).map(ms),
        phases: chain.iter().map(|p| p.json_name()).collect(),
        starts: starts.iter().map(entry).collect(),
    }
}

fn entry(s: &ColdStart) -> ColdStartEntry {
    let (outcome, ended_by) = match s.outcome {
        Outcome::InProgress => ("inProgress", None),
        Outcome::Complete => ("complete", None),
        Outcome::Incomplete(why) => ("incomplete", Some(why.json_name())),
    };
    ColdStartEntry {
        worker: s.worker.clone(),
        kind: s.kind.json_name(),
        outcome,
        ended_by,
        phases: s
            .marks()
            .map(|(phase, mark)| PhaseEntry {
                phase: phase.json_name(),
                at: rfc3339(mark.at_ms),
                seen: mark.seen,
            })
            .collect(),
        durations: s
            .segments()
            .iter()
            .map(|g| DurationEntry {
                from: g.from.json_name(),
                to: g.to.json_name(),
                ms: u64::try_from(g.duration.as_millis()).unwrap_or(u64::MAX),
            })
            .collect(),
        total_ms: s
            .total()
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::phase::{Mark, Phase};
    use super::super::record::{Incomplete, StartKind};
    use super::*;

    const T: u64 = 1_800_000_000_000;

    #[test]
    fn the_shape_the_page_reads() {
        let mut complete = ColdStart::new("w-1", StartKind::FromZero, Phase::AIRFLOW_ONLY);
        complete.mark(Phase::BacklogSeen, Mark::sentinel(T));
        complete.mark(Phase::AgentRegistered, Mark::airflow(T + 1_250));
        complete.mark(Phase::FirstTaskRunning, Mark::airflow(T + 2_000));
        complete.outcome = Outcome::Complete;
        let mut gone = ColdStart::new("w-2", StartKind::Additional, Phase::AIRFLOW_ONLY);
        gone.mark(Phase::BacklogSeen, Mark::sentinel(T + 5_000));
        gone.outcome = Outcome::Incomplete(Incomplete::WorkerGone);
        let json = serde_json::to_value(cold_starts_answer(&[complete, gone], Phase::AIRFLOW_ONLY))
            .unwrap();
        assert_eq!(
            json["phases"],
            serde_json::json!(["backlogSeen", "agentRegistered", "firstTaskRunning"])
        );
        assert_eq!(
            (json["totalP50Ms"].as_u64(), json["totalP90Ms"].as_u64()),
            (Some(2000), Some(2000))
        );
        assert_eq!(
            json["starts"][0],
            serde_json::json!({"worker": "w-1", "kind": "fromZero", "outcome": "complete",
                "endedBy": null,
                "phases": [
                    {"phase": "backlogSeen", "at": "2027-01-15T08:00:00Z", "seen": "sentinel"},
                    {"phase": "agentRegistered", "at": "2027-01-15T08:00:01.250Z", "seen": "airflow"},
                    {"phase": "firstTaskRunning", "at": "2027-01-15T08:00:02Z", "seen": "airflow"}],
                "durations": [
                    {"from": "backlogSeen", "to": "agentRegistered", "ms": 1250},
                    {"from": "agentRegistered", "to": "firstTaskRunning", "ms": 750}],
                "totalMs": 2000})
        );
        assert_eq!(json["starts"][1]["outcome"], "incomplete");
        assert_eq!(json["starts"][1]["endedBy"], "workerGone");
        assert_eq!(json["starts"][1]["totalMs"], serde_json::Value::Null);
        let none = serde_json::to_value(cold_starts_answer(&[], Phase::KUBERNETES)).unwrap();
        assert_eq!(none["totalP50Ms"], serde_json::Value::Null);
        assert_eq!(none["phases"].as_array().unwrap().len(), 6);
    }
}
