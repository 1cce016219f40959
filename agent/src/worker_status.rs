//! What this worker tells Airflow about itself, and what Airflow's heartbeat answers change.

use crate::versions::{Reported, Versions};
use airflow::edge_types::{HeartbeatAnswer, SysInfo, WorkerState, WorkerStateBody};
use std::sync::Mutex;

pub struct WorkerStatus {
    /// What is reported; Airflow's answers may replace it (see [`crate::registration`]).
    versions: Mutex<Versions>,
    inner: Mutex<Inner>,
}

struct Inner {
    queues: Vec<String>,
    maintenance: bool,
    maintenance_comments: Option<String>,
}

/// What a heartbeat answer asks the agent to do beyond updating its own fields.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Requests {
    pub shutdown: bool,
    pub concurrency: Option<u32>,
    pub maintenance_changed: bool,
}

impl WorkerStatus {
    pub fn new(queues: Vec<String>, versions: Versions) -> Self {
        WorkerStatus {
            versions: Mutex::new(versions),
            inner: Mutex::new(Inner {
                queues,
                maintenance: false,
                maintenance_comments: None,
            }),
        }
    }

    pub fn versions(&self) -> Versions {
        self.versions.lock().unwrap().clone()
    }

    pub fn set_airflow_version(&self, version: Reported) {
        self.versions.lock().unwrap().airflow = Some(version);
    }

    pub fn set_edge_provider_version(&self, version: Reported) {
        self.versions.lock().unwrap().edge_provider = version;
    }

    pub fn queues(&self) -> Vec<String> {
        self.inner.lock().unwrap().queues.clone()
    }

    pub fn in_maintenance(&self) -> bool {
        self.inner.lock().unwrap().maintenance
    }

    /// The state to report, following the edge3 worker's rules: busy workers are `running`
    /// (or `terminating` / `maintenance pending`), idle ones `idle` (or `offline` /
    /// `maintenance mode`); `draining && jobs == 0` is the final goodbye.
    pub fn state(&self, jobs_active: u32, draining: bool) -> WorkerState {
        let maintenance = self.in_maintenance();
        match (jobs_active > 0, draining, maintenance) {
            (true, true, _) => WorkerState::Terminating,
            (true, false, true) => WorkerState::MaintenancePending,
            (true, false, false) => WorkerState::Running,
            (false, true, true) => WorkerState::OfflineMaintenance,
            (false, true, false) => WorkerState::Offline,
            (false, false, true) => WorkerState::MaintenanceMode,
            (false, false, false) => WorkerState::Idle,
        }
    }

    pub fn body(
        &self,
        state: WorkerState,
        jobs_active: u32,
        concurrency: u32,
        free: u32,
    ) -> WorkerStateBody {
        let inner = self.inner.lock().unwrap();
        let versions = self.versions.lock().unwrap();
        WorkerStateBody {
            state,
            jobs_active,
            queues: inner.queues.clone(),
            sysinfo: SysInfo {
                // Registration learns the Airflow version before anything is sent.
                airflow_version: versions
                    .airflow
                    .as_ref()
                    .map(|v| v.version.clone())
                    .unwrap_or_default(),
                edge_provider_version: versions.edge_provider.version.clone(),
                concurrency,
                free_concurrency: free,
            },
            maintenance_comments: inner.maintenance_comments.clone(),
        }
    }

    /// Takes the server's view: it owns queues, concurrency and maintenance.
    pub fn apply(&self, answer: &HeartbeatAnswer, current_concurrency: u32) -> Requests {
        let mut inner = self.inner.lock().unwrap();
        let mut requests = Requests::default();
        if let Some(queues) = &answer.queues {
            if !queues.is_empty() && *queues != inner.queues {
                tracing::info!(?queues, "queues changed by Airflow");
                inner.queues = queues.clone();
            }
        }
        if let Some(concurrency) = answer.concurrency {
            if concurrency > 0 && concurrency != current_concurrency {
                tracing::info!(
                    from = current_concurrency,
                    to = concurrency,
                    "concurrency changed by Airflow"
                );
                requests.concurrency = Some(concurrency);
            }
        }
        let was = inner.maintenance;
        match answer.state {
            WorkerState::MaintenanceRequest
            | WorkerState::MaintenancePending
            | WorkerState::MaintenanceMode => inner.maintenance = true,
            WorkerState::MaintenanceExit | WorkerState::Idle | WorkerState::Running => {
                inner.maintenance = false
            }
            WorkerState::ShutdownRequest => requests.shutdown = true,
            _ => {}
        }
        inner.maintenance_comments = if inner.maintenance {
            answer.maintenance_comments.clone()
        } else {
            None
        };
        if was != inner.maintenance {
            tracing::info!(
                maintenance = inner.maintenance,
                "maintenance mode changed by Airflow"
            );
            requests.maintenance_changed = true;
        }
        requests
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> WorkerStatus {
        let detected = crate::task_host_protocol::DetectedVersions {
            airflow: Some("3.3.2".into()),
            edge_provider: Some("5.1.0".into()),
            problem: None,
        };
        let versions = crate::versions::resolve(&detected, None, None);
        WorkerStatus::new(vec!["default".into()], versions)
    }

    fn answer(state: WorkerState) -> HeartbeatAnswer {
        HeartbeatAnswer {
            state,
            queues: None,
            maintenance_comments: Some("disk swap".into()),
            concurrency: None,
        }
    }

    #[test]
    fn state_follows_jobs_drain_and_maintenance() {
        let s = status();
        assert_eq!(s.state(0, false), WorkerState::Idle);
        assert_eq!(s.state(2, false), WorkerState::Running);
        assert_eq!(s.state(2, true), WorkerState::Terminating);
        assert_eq!(s.state(0, true), WorkerState::Offline);
        s.apply(&answer(WorkerState::MaintenanceRequest), 4);
        assert_eq!(s.state(1, false), WorkerState::MaintenancePending);
        assert_eq!(s.state(0, false), WorkerState::MaintenanceMode);
        assert_eq!(s.state(0, true), WorkerState::OfflineMaintenance);
    }

    #[test]
    fn heartbeat_answer_wins() {
        let s = status();
        let mut a = answer(WorkerState::MaintenanceRequest);
        a.queues = Some(vec!["a".into(), "b".into()]);
        a.concurrency = Some(8);
        let r = s.apply(&a, 4);
        assert_eq!(r.concurrency, Some(8));
        assert!(r.maintenance_changed);
        assert!(!r.shutdown);
        assert_eq!(s.queues(), vec!["a", "b"]);
        let body = s.body(WorkerState::MaintenanceMode, 0, 8, 8);
        assert_eq!(body.maintenance_comments.as_deref(), Some("disk swap"));

        let r = s.apply(&answer(WorkerState::MaintenanceExit), 8);
        assert!(r.maintenance_changed);
        assert!(!s.in_maintenance());
        assert_eq!(r.concurrency, None);

        let r = s.apply(&answer(WorkerState::ShutdownRequest), 8);
        assert!(r.shutdown);
    }

    #[test]
    fn empty_or_missing_queues_keep_ours() {
        let s = status();
        let mut a = answer(WorkerState::Idle);
        a.queues = Some(vec![]);
        s.apply(&a, 4);
        assert_eq!(s.queues(), vec!["default"]);
    }
}
