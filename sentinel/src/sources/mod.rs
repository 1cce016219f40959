//! Where queue depth comes from. A source answers, for a list of queues, each queue's queued
//! and running task instances — as tasks, as task slots (Σ `pool_slots`), and how long the
//! oldest queued one has waited — or, per queue, why it could not.
//!
//! Executor callbacks (Airflow 3.3 with edge3 5.x) are in the backlog as the Edge executor
//! counts them: each one job of one slot, queued then running, on `[operators] default_queue`
//! (see [`airflow::edge_callback_jobs`]); a source that cannot read them says so in its log and
//! counts the task instances alone.
//!
//! Two implementations: [`airflow_api`] (Airflow's REST API, listing the
//! queue's queued and running task instances page by page) and [`postgres`]
//! (one `GROUP BY` over the metadata database for all queues at once). The refresh loop calls
//! [`BacklogSource::fetch`] once per interval with every distinct queue, however many workers
//! share a queue and however often KEDA asks.

pub mod airflow_api;
pub mod postgres;

use airflow::edge_worker_list::ListedEdgeWorker;
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// One queue's backlog as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueBacklog {
    pub queued_tasks: u64,
    pub running_tasks: u64,
    /// Σ `pool_slots` of the queued task instances: the worker slots they will take (an Edge
    /// job's `concurrency_slots` is its task's `pool_slots`).
    pub queued_slots: u64,
    /// Σ `pool_slots` of the running task instances.
    pub running_slots: u64,
    /// How long the longest-waiting queued task instance had been queued when the queue was
    /// read; `None` when none is queued.
    pub oldest_queued_age: Option<Duration>,
}

impl QueueBacklog {
    /// This backlog plus `callbacks` executor callbacks (one task and one slot each), the
    /// longest-waiting of the queued ones having waited `oldest_queued_age`.
    pub fn with_callbacks(
        self,
        queued: u64,
        running: u64,
        oldest_queued_age: Option<Duration>,
    ) -> Self {
        QueueBacklog {
            queued_tasks: self.queued_tasks + queued,
            running_tasks: self.running_tasks + running,
            queued_slots: self.queued_slots + queued,
            running_slots: self.running_slots + running,
            oldest_queued_age: self.oldest_queued_age.max(oldest_queued_age),
        }
    }

    /// `queued` and `running` task instances of one pool slot each, none queued long enough to
    /// have an age: the backlog the tests feed the Sentinel's views with.
    pub fn one_slot_tasks(queued: u64, running: u64) -> Self {
        QueueBacklog {
            queued_tasks: queued,
            running_tasks: running,
            queued_slots: queued,
            running_slots: running,
            oldest_queued_age: None,
        }
    }
}

/// The outcome for one queue: its backlog, or a one-line reason (never containing secrets).
pub type QueueOutcome = Result<QueueBacklog, String>;

pub trait BacklogSource: Send + Sync + 'static {
    /// `airflow-api` or `postgres` (the `source` label of the upstream metrics).
    fn kind(&self) -> &'static str;

    /// One outcome for every queue in `queues`, in any order.
    fn fetch<'a>(&'a self, queues: &'a [String]) -> BoxFuture<'a, Vec<(String, QueueOutcome)>>;

    /// Task slots (Σ `pool_slots`) of the task instances running on `queues`, by the hostname
    /// of the worker that runs them (a worker pod's name), or a one-line reason.
    fn running_slots_by_host<'a>(
        &'a self,
        queues: &'a [String],
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, String>>;

    /// When each of `hosts` (worker names, which Airflow records as the task instance's
    /// hostname) started its first task on any of `queues`, among the task instances that
    /// started at or after `since`; a host with no such task instance is left out. Or a
    /// one-line reason.
    fn first_task_starts<'a>(
        &'a self,
        queues: &'a [String],
        hosts: &'a [String],
        since: SystemTime,
    ) -> BoxFuture<'a, Result<HashMap<String, SystemTime>, String>> {
        let _ = (queues, hosts, since);
        Box::pin(std::future::ready(Err(format!(
            "the {} source does not list started task instances",
            self.kind()
        ))))
    }

    /// Task instances on each of `queues` that Airflow holds in `scheduled` (by `[core]
    /// parallelism`, a pool's slots, a DAG's `max_active_tasks`...): they wait, but Airflow has
    /// not queued them, so no worker could take them and they are not in the backlog. Every
    /// queue of `queues` is in the answer, or a one-line reason.
    fn held_tasks<'a>(
        &'a self,
        queues: &'a [String],
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, String>> {
        let _ = queues;
        Box::pin(std::future::ready(Err(format!(
            "the {} source does not count scheduled task instances",
            self.kind()
        ))))
    }

    /// Airflow's list of Edge workers (outside Kubernetes, the only count of running
    /// workers), or a one-line reason.
    fn edge_workers(&self) -> BoxFuture<'_, Result<Vec<ListedEdgeWorker>, String>> {
        Box::pin(std::future::ready(Err(format!(
            "the {} source does not list Edge workers",
            self.kind()
        ))))
    }
}
