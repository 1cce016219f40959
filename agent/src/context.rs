//! What the agent's loops share: clients, slots, status and the stop signals.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::settings_drift::SettingsDrift;
use crate::slots::Slots;
use crate::task_host_client::TaskHost;
use crate::wake::Wake;
use crate::worker_status::WorkerStatus;
use airflow::edge_client::EdgeClient;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub struct Context {
    pub config: Config,
    pub edge: EdgeClient,
    pub metrics: Arc<Metrics>,
    pub slots: Slots,
    pub status: WorkerStatus,
    /// Whether Airflow has changed the concurrency or queues the autoscaler assumes.
    pub drift: SettingsDrift,
    pub task_host: Arc<TaskHost>,
    /// Running jobs; "all work finished" is this tracker being closed and empty.
    pub jobs: TaskTracker,
    /// Stop fetching: SIGTERM, SIGINT, or Airflow's `shutdown request`.
    pub drain: CancellationToken,
    /// Stop running tasks: a second signal or the drain deadline.
    pub kill: CancellationToken,
    /// Stop retrying reports: the agent is about to exit whatever Airflow says.
    pub give_up: CancellationToken,
    /// Something the next heartbeat should tell Airflow at once (a job started or ended,
    /// drain began).
    pub heartbeat_now: Notify,
    /// Airflow turned maintenance mode on or off: the fetch loop stops or resumes asking.
    pub maintenance_changed: Notify,
    /// The Sentinel subscription's wake-ups for the fetch loop.
    pub wake: Wake,
}

impl Context {
    pub fn jobs_active(&self) -> u32 {
        self.jobs.len() as u32
    }
}
