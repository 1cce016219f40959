//! Executor callbacks waiting for or running on Edge workers (Airflow 3.3 with edge3 5.x:
//! a deadline alert's `SyncCallback`, say). They are Edge jobs but not task instances, so the
//! REST API's task-instance counts never see them; the edge3 provider's UI API lists them
//! (`GET /edge_worker/ui/jobs`), as its `edge_job` table holds them.
//!
//! How the Edge executor counts a callback, and so how it is counted here: one job of one
//! worker slot (`concurrency_slots` 1) on the queue `[operators] default_queue` names,
//! `queued` until a worker fetches it and `running` until the worker reports its end. The
//! provider tells a callback from a task by its whole synthetic identity (dag id
//! `ExecuteCallback`, run id `ExecuteCallback-<callback id>`, try 0, map index -1): a DAG
//! may be called `ExecuteCallback` too.

use crate::error::ApiError;
use crate::rest_api::RestApiClient;
use serde::Deserialize;
use std::collections::HashMap;
use std::time::SystemTime;

/// The dag id the Edge executor gives every callback job.
pub const CALLBACK_DAG_ID: &str = "ExecuteCallback";

const CALL: &str = "rest_edge_callback_jobs";

/// One row of the provider's job list (the fields the count needs).
#[derive(Debug, Clone, Deserialize)]
pub struct ListedEdgeJob {
    pub dag_id: String,
    pub task_id: String,
    pub run_id: String,
    pub map_index: i64,
    pub try_number: i64,
    pub state: String,
    pub queue: String,
    /// When the job was queued (RFC 3339, Airflow's clock).
    #[serde(default)]
    pub queued_dttm: Option<String>,
}

#[derive(Deserialize)]
struct EdgeJobPage {
    jobs: Vec<ListedEdgeJob>,
}

/// Whether a job with this identity is a callback, by the rule the provider itself applies.
pub fn is_callback_job(
    dag_id: &str,
    task_id: &str,
    run_id: &str,
    try_number: i64,
    map_index: i64,
) -> bool {
    dag_id == CALLBACK_DAG_ID
        && run_id
            .strip_prefix(CALLBACK_DAG_ID)
            .and_then(|r| r.strip_prefix('-'))
            == Some(task_id)
        && try_number == 0
        && map_index == -1
}

/// Callbacks of one queue, queued and running; each takes one worker slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCallbacks {
    pub queued: u64,
    pub running: u64,
    /// When the longest-waiting queued callback was queued (Airflow's clock).
    pub oldest_queued: Option<SystemTime>,
}

/// Queued and running callbacks by queue, from a job list (other jobs are left out).
pub fn callbacks_by_queue(jobs: &[ListedEdgeJob]) -> HashMap<String, QueueCallbacks> {
    let mut by_queue: HashMap<String, QueueCallbacks> = HashMap::new();
    for job in jobs
        .iter()
        .filter(|j| is_callback_job(&j.dag_id, &j.task_id, &j.run_id, j.try_number, j.map_index))
    {
        let counts = by_queue.entry(job.queue.clone()).or_default();
        match job.state.as_str() {
            "queued" => {
                counts.queued += 1;
                let queued_at = job
                    .queued_dttm
                    .as_deref()
                    .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                    .map(SystemTime::from);
                counts.oldest_queued = match (counts.oldest_queued, queued_at) {
                    (Some(oldest), Some(at)) => Some(oldest.min(at)),
                    (oldest, at) => oldest.or(at),
                };
            }
            "running" => counts.running += 1,
            _ => {}
        }
    }
    by_queue
}

/// What a read of the callbacks found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackCount {
    /// Queued and running callbacks by queue (a queue without any is absent).
    Counted(HashMap<String, QueueCallbacks>),
    /// The list is closed to these credentials (no `JOBS` view): callbacks cannot be counted,
    /// which the caller says, and counts the tasks alone rather than nothing at all.
    Forbidden(String),
}

impl RestApiClient {
    /// Queued and running callbacks by queue, in one request for all queues. A provider that
    /// serves no job list (404: an edge3 without the UI API, which queues no callbacks
    /// either) has none. Needs the `JOBS` view permission, as [`Self::edge_workers`] does.
    pub async fn callbacks_by_queue(&self) -> Result<CallbackCount, ApiError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http(s) base URL always has path segments")
            .extend(["edge_worker", "ui", "jobs"]);
        url.query_pairs_mut()
            // The provider filters with ILIKE '%pattern%': the identity check above does the rest.
            .append_pair("dag_id_pattern", CALLBACK_DAG_ID)
            .append_pair("state", "queued")
            .append_pair("state", "running");
        match self.get_json::<EdgeJobPage>(CALL, url).await {
            Ok(page) => Ok(CallbackCount::Counted(callbacks_by_queue(&page.jobs))),
            Err(e) if e.status() == Some(404) => Ok(CallbackCount::Counted(HashMap::new())),
            Err(e) if matches!(e.status(), Some(401 | 403)) => Ok(CallbackCount::Forbidden(
                format!("the Edge job list needs the JOBS view permission ({e})"),
            )),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(dag_id: &str, task_id: &str, run_id: &str, state: &str, queue: &str) -> ListedEdgeJob {
        ListedEdgeJob {
            dag_id: dag_id.into(),
            task_id: task_id.into(),
            run_id: run_id.into(),
            map_index: -1,
            try_number: 0,
            state: state.into(),
            queue: queue.into(),
            queued_dttm: None,
        }
    }

    #[test]
    fn only_the_full_callback_identity_is_a_callback() {
        assert!(is_callback_job(
            "ExecuteCallback",
            "c1",
            "ExecuteCallback-c1",
            0,
            -1
        ));
        assert!(!is_callback_job(
            "ExecuteCallback",
            "c1",
            "ExecuteCallback-c2",
            0,
            -1
        ));
        assert!(!is_callback_job("ExecuteCallback", "t", "manual__1", 1, -1));
        assert!(!is_callback_job(
            "ExecuteCallback",
            "c1",
            "ExecuteCallback-c1",
            1,
            -1
        ));
        assert!(!is_callback_job(
            "ExecuteCallback",
            "c1",
            "ExecuteCallback-c1",
            0,
            0
        ));
        assert!(!is_callback_job("other", "c1", "ExecuteCallback-c1", 0, -1));
    }

    #[test]
    fn callbacks_are_counted_by_queue_and_state_with_the_oldest_queued() {
        let mut old = job(
            "ExecuteCallback",
            "a",
            "ExecuteCallback-a",
            "queued",
            "default",
        );
        old.queued_dttm = Some("2026-01-01T10:00:00Z".into());
        let mut new = job(
            "ExecuteCallback",
            "b",
            "ExecuteCallback-b",
            "queued",
            "default",
        );
        new.queued_dttm = Some("2026-01-01T10:00:00.5Z".into());
        let jobs = vec![
            new,
            old,
            job(
                "ExecuteCallback",
                "c",
                "ExecuteCallback-c",
                "running",
                "default",
            ),
            job(
                "ExecuteCallback",
                "d",
                "ExecuteCallback-d",
                "running",
                "other",
            ),
            // A DAG called ExecuteCallback: a task, not a callback.
            job("ExecuteCallback", "t", "manual__1", "queued", "default"),
        ];
        let counts = callbacks_by_queue(&jobs);
        assert_eq!(
            counts["default"],
            QueueCallbacks {
                queued: 2,
                running: 1,
                oldest_queued: Some(SystemTime::from(
                    chrono::DateTime::parse_from_rfc3339("2026-01-01T10:00:00Z").unwrap()
                ))
            }
        );
        assert_eq!(counts["other"].running, 1);
        assert_eq!(counts.len(), 2);
    }
}
