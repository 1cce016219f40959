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
        let state: Option<WorkerState> =
            serde_json::from_value(serde_json::Value::String(self.state.clone())).ok();
        match state {
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
