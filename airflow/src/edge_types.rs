//! The Edge Worker API's wire types (edge3 provider 5.x).

use serde::{Deserialize, Serialize};
use std::path::{Component, Path};

/// A worker's state as the Edge API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerState {
    #[serde(rename = "starting")]
    Starting,
    #[serde(rename = "running")]
    Running,
    #[serde(rename = "idle")]
    Idle,
    #[serde(rename = "shutdown request")]
    ShutdownRequest,
    #[serde(rename = "terminating")]
    Terminating,
    #[serde(rename = "offline")]
    Offline,
    #[serde(rename = "unknown")]
    Unknown,
    #[serde(rename = "maintenance request")]
    MaintenanceRequest,
    #[serde(rename = "maintenance pending")]
    MaintenancePending,
    #[serde(rename = "maintenance mode")]
    MaintenanceMode,
    #[serde(rename = "maintenance exit")]
    MaintenanceExit,
    #[serde(rename = "offline maintenance")]
    OfflineMaintenance,
}

/// Facts about the worker the server checks (versions) or shows (concurrency).
#[derive(Debug, Clone, Serialize)]
pub struct SysInfo {
    pub airflow_version: String,
    pub edge_provider_version: String,
    pub concurrency: u32,
    pub free_concurrency: u32,
}

/// Body of register (`POST worker/{name}`) and heartbeat (`PATCH worker/{name}`).
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStateBody {
    pub state: WorkerState,
    pub jobs_active: u32,
    pub queues: Vec<String>,
    pub sysinfo: SysInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance_comments: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RegisterAnswer {
    #[serde(default)]
    pub versions_match: Option<bool>,
}

/// What a heartbeat answers: the server's view of this worker, which wins over ours.
#[derive(Debug, Clone, Deserialize)]
pub struct HeartbeatAnswer {
    pub state: WorkerState,
    #[serde(default)]
    pub queues: Option<Vec<String>>,
    #[serde(default)]
    pub maintenance_comments: Option<String>,
    #[serde(default)]
    pub concurrency: Option<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FetchBody<'a> {
    pub queues: &'a [String],
    pub free_concurrency: u32,
    /// Tells newer cores that we echo `task_instance_id` back when reporting states.
    pub supports_task_instance_uuid: bool,
}

/// A job handed to this worker. `command` is Airflow's workload and is passed to the task
/// process unchanged, so it stays raw JSON here.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EdgeJob {
    pub dag_id: String,
    pub task_id: String,
    pub run_id: String,
    pub map_index: i64,
    pub try_number: i64,
    pub command: serde_json::Value,
    #[serde(default = "one_slot")]
    pub concurrency_slots: u32,
    #[serde(default)]
    pub task_instance_id: Option<String>,
}

fn one_slot() -> u32 {
    1
}

impl EdgeJob {
    pub fn key(&self) -> TaskKey {
        TaskKey {
            dag_id: self.dag_id.clone(),
            task_id: self.task_id.clone(),
            run_id: self.run_id.clone(),
            try_number: self.try_number,
            map_index: self.map_index,
            task_instance_id: self.task_instance_id.clone(),
        }
    }

    /// `command.log_path`: where the task writes its log, relative to the log folder. `None`
    /// when missing, or when it would lead out of the folder (absolute, `..`): the worker reads
    /// that file and sends it to Airflow, so a path from the server must not name any other.
    pub fn log_path(&self) -> Option<&Path> {
        let path = Path::new(self.command.get("log_path")?.as_str()?);
        let inside = path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        (inside && path.components().next().is_some()).then_some(path)
    }
}

/// Identifies one try of one task instance in the job-state and log-push paths.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub dag_id: String,
    pub task_id: String,
    pub run_id: String,
    pub try_number: i64,
    pub map_index: i64,
    pub task_instance_id: Option<String>,
}

impl std::fmt::Display for TaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{} run={} try={}",
            self.dag_id, self.task_id, self.run_id, self.try_number
        )?;
        if self.map_index >= 0 {
            write!(f, " map={}", self.map_index)?;
        }
        Ok(())
    }
}

/// The end states a worker reports for a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Running,
    Success,
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Success => "success",
            JobState::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct JobStateBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_instance_id: Option<&'a str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PushLogsBody<'a> {
    pub log_chunk_time: String,
    pub log_chunk_data: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_instance_id: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_use_the_servers_spelling() {
        let s = serde_json::to_string(&WorkerState::MaintenancePending).unwrap();
        assert_eq!(s, "\"maintenance pending\"");
        let back: WorkerState = serde_json::from_str("\"shutdown request\"").unwrap();
        assert_eq!(back, WorkerState::ShutdownRequest);
    }

    #[test]
    fn a_log_path_that_leads_out_of_the_log_folder_is_refused() {
        let job = |log_path: &str| -> EdgeJob {
            serde_json::from_value(serde_json::json!({
                "dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1,
                "command": {"log_path": log_path}, "task_instance_id": null
            }))
            .unwrap()
        };
        for bad in ["/etc/passwd", "../secret", "dag_id=d/../../x.log", ""] {
            assert_eq!(job(bad).log_path(), None, "{bad:?}");
        }
        assert_eq!(
            job("dag_id=d/run_id=r/attempt=1.log").log_path(),
            Some(Path::new("dag_id=d/run_id=r/attempt=1.log"))
        );
    }

    #[test]
    fn a_job_parses_with_and_without_task_instance_id() {
        let job: EdgeJob = serde_json::from_value(serde_json::json!({
            "dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1,
            "command": {"type": "ExecuteTask", "log_path": "dag_id=d/x.log", "token": "tok"},
            "concurrency_slots": 2, "task_instance_id": null
        }))
        .unwrap();
        assert_eq!(job.concurrency_slots, 2);
        assert_eq!(job.log_path(), Some(Path::new("dag_id=d/x.log")));
        assert!(job.task_instance_id.is_none());
        let job: EdgeJob = serde_json::from_value(serde_json::json!({
            "dag_id": "d", "task_id": "t", "run_id": "r", "map_index": 3, "try_number": 2,
            "command": {}, "task_instance_id": "0195f2a8-4f4e-7c1b-9a1e-1234567890ab"
        }))
        .unwrap();
        assert_eq!(job.concurrency_slots, 1);
        assert_eq!(job.key().to_string(), "d.t run=r try=2 map=3");
    }
}
