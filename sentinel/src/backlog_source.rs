//! Where queue depth comes from. A source answers, for a list of queues, the queued and
//! running task-instance counts of each — or, per queue, why it could not.
//!
//! Two implementations: [`crate::airflow_api_source`] (Airflow's REST API, two requests per
//! queue) and [`crate::postgres_source`] (one `GROUP BY` over the metadata database for all
//! queues at once). The refresh loop calls [`BacklogSource::fetch`] once per interval with
//! every distinct queue, however many workers share a queue and however often KEDA asks.

use airflow::edge_worker_list::ListedEdgeWorker;
use airflow::rest_api::QueueCounts;
use futures_util::future::BoxFuture;
use std::collections::HashMap;

/// The outcome for one queue: its counts, or a one-line reason (never containing secrets).
pub type QueueOutcome = Result<QueueCounts, String>;

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

    /// Airflow's list of Edge workers (outside Kubernetes, the only count of running
    /// workers), or a one-line reason.
    fn edge_workers(&self) -> BoxFuture<'_, Result<Vec<ListedEdgeWorker>, String>> {
        Box::pin(std::future::ready(Err(format!(
            "the {} source does not list Edge workers",
            self.kind()
        ))))
    }
}
