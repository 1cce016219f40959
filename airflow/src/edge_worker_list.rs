//! Airflow's own list of Edge workers (the provider's `GET /edge_worker/ui/worker`, or its
//! `edge_worker` table): who is online for which queues. Outside Kubernetes this is the only
//! record of how many workers run.

use crate::edge_types::WorkerState;
use serde::Deserialize;

/// One row of the list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ListedEdgeWorker {
    pub worker_name: String,
    /// The state as the provider spells it; kept as text so that a state added by a later
    /// provider version is read as absent instead of failing the whole list.
    pub state: String,
    /// `None`: the worker takes jobs from every queue.
    pub queues: Option<Vec<String>>,
    /// When the worker first registered (RFC 3339, Airflow's clock); kept across its
    /// re-registrations under the same name.
    #[serde(default)]
    pub first_online: Option<String>,
    /// What the worker last reported of itself in its heartbeat; `None` before its first.
    #[serde(default)]
    pub sysinfo: Option<ReportedSysInfo>,
}

/// The part of a worker's `sysinfo` the list is read for. The provider keeps the map as the
/// worker sent it (text, whole or decimal numbers), so a value of another type reads as
/// absent rather than failing the whole list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ReportedSysInfo {
    #[serde(default)]
    concurrency: Option<serde_json::Value>,
}

impl ReportedSysInfo {
    /// Reads the JSON text the provider stores in its `edge_worker.sysinfo` column; text
    /// that is not such a map reads as nothing reported.
    pub fn from_json_text(text: &str) -> Option<ReportedSysInfo> {
        serde_json::from_str(text).ok()
    }
}

/// What a listed worker's state means for the count of running workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Up and heartbeating: fetching jobs, or paused for maintenance while its process runs.
    Online,
    /// Asked to stop, or draining its last jobs before it exits.
    Leaving,
    /// Starting, offline, silent (`unknown`) or a state this version does not know.
    Absent,
}

impl ListedEdgeWorker {
    pub fn presence(&self) -> Presence {
        match self.known_state() {
            Some(
                WorkerState::Running
                | WorkerState::Idle
                | WorkerState::MaintenanceRequest
                | WorkerState::MaintenancePending
                | WorkerState::MaintenanceMode
                | WorkerState::MaintenanceExit,
            ) => Presence::Online,
            Some(WorkerState::ShutdownRequest | WorkerState::Terminating) => Presence::Leaving,
            _ => Presence::Absent,
        }
    }

    /// The task slots the worker runs with, as it reported them (`sysinfo.concurrency`).
    pub fn concurrency(&self) -> Option<u32> {
        let reported = self.sysinfo.as_ref()?.concurrency.as_ref()?.as_u64()?;
        u32::try_from(reported).ok().filter(|slots| *slots > 0)
    }

    /// Whether the worker is in, or on its way into, maintenance: online, but taking no new
    /// jobs until someone ends it.
    pub fn in_maintenance(&self) -> bool {
        matches!(
            self.known_state(),
            Some(
                WorkerState::MaintenanceRequest
                    | WorkerState::MaintenancePending
                    | WorkerState::MaintenanceMode
            )
        )
    }

    fn known_state(&self) -> Option<WorkerState> {
        serde_json::from_value(serde_json::Value::String(self.state.clone())).ok()
    }

    /// Whether the worker takes jobs from any of `queues`.
    pub fn serves_any(&self, queues: &[String]) -> bool {
        match &self.queues {
            None => true,
            Some(own) => own.iter().any(|q| queues.contains(q)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(state: &str, queues: Option<&[&str]>) -> ListedEdgeWorker {
        ListedEdgeWorker {
            worker_name: "w".into(),
            state: state.into(),
            queues: queues.map(|q| q.iter().map(|s| s.to_string()).collect()),
            first_online: None,
            sysinfo: None,
        }
    }

    #[test]
    fn concurrency_is_read_from_sysinfo_and_odd_values_are_absent() {
        let with = |sysinfo: &str| ListedEdgeWorker {
            sysinfo: ReportedSysInfo::from_json_text(sysinfo),
            ..listed("idle", None)
        };
        assert_eq!(
            with(r#"{"concurrency": 8, "free_concurrency": 8}"#).concurrency(),
            Some(8)
        );
        for odd in [
            r#"{"concurrency": "8"}"#,
            r#"{"concurrency": -1}"#,
            r#"{"concurrency": 0}"#,
            "{}",
            "not json",
        ] {
            assert_eq!(with(odd).concurrency(), None, "{odd}");
        }
        let page: ListedEdgeWorker = serde_json::from_str(
            r#"{"worker_name": "w", "state": "idle", "queues": null, "sysinfo": {"concurrency": 4, "airflow_version": "3.1.0"}}"#,
        )
        .unwrap();
        assert_eq!(page.concurrency(), Some(4));
    }

    #[test]
    fn maintenance_states_are_online_and_in_maintenance() {
        for (state, maintenance) in [
            ("maintenance request", true),
            ("maintenance pending", true),
            ("maintenance mode", true),
            ("maintenance exit", false),
            ("offline maintenance", false),
            ("idle", false),
        ] {
            assert_eq!(listed(state, None).in_maintenance(), maintenance, "{state}");
        }
    }

    #[test]
    fn states_map_to_presence() {
        for (state, presence) in [
            ("idle", Presence::Online),
            ("running", Presence::Online),
            ("maintenance mode", Presence::Online),
            ("shutdown request", Presence::Leaving),
            ("terminating", Presence::Leaving),
            ("starting", Presence::Absent),
            ("offline", Presence::Absent),
            ("unknown", Presence::Absent),
            ("offline maintenance", Presence::Absent),
            ("a state from a later provider", Presence::Absent),
        ] {
            assert_eq!(listed(state, None).presence(), presence, "{state}");
        }
    }

    #[test]
    fn no_queue_list_serves_every_queue() {
        let queues = vec!["gpu".to_string()];
        assert!(listed("idle", None).serves_any(&queues));
        assert!(listed("idle", Some(&["default", "gpu"])).serves_any(&queues));
        assert!(!listed("idle", Some(&["default"])).serves_any(&queues));
    }
}
