//! What Airflow knows about the work to come, from the public REST API v2: which DAGs are
//! active and when each runs next (`GET /api/v2/dags`), which queue each task uses and how
//! many slots it takes (`GET /api/v2/dags/{dag_id}/tasks`), a DAG's latest finished runs and
//! their task instances (for what a run needed at its start).
//!
//! Times stay the RFC 3339 text Airflow sent; the caller parses what it uses.

use crate::error::ApiError;
use crate::rest_api::{call, RestApiClient, PAGE_REQUEST};
use serde::Deserialize;
use url::Url;

/// One DAG as `GET /api/v2/dags` lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct ListedDag {
    pub dag_id: String,
    pub is_paused: bool,
    /// When the scheduler will create the DAG's next run (RFC 3339); `None` for a DAG
    /// without a schedule or past its end date.
    pub next_dagrun_run_after: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct DagPage {
    pub dags: Vec<ListedDag>,
    pub total_entries: u64,
}

/// One task of a DAG, as `GET /api/v2/dags/{dag_id}/tasks` describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct DagTask {
    pub task_id: Option<String>,
    /// `None` is the default queue.
    pub queue: Option<String>,
    /// Worker slots each of its task instances takes (Airflow sends a number, maybe `2.0`).
    pub pool_slots: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct DagTasks {
    tasks: Vec<DagTask>,
}

/// One run of a DAG.
#[derive(Debug, Clone, Deserialize)]
pub struct ListedDagRun {
    pub dag_run_id: String,
    pub run_after: String,
    pub state: Option<String>,
}

#[derive(Debug, Deserialize)]
struct DagRunPage {
    dag_runs: Vec<ListedDagRun>,
}

/// A task instance of a run, with the times that tell when it took its slots.
#[derive(Debug, Clone, Deserialize)]
pub struct RunTaskInstance {
    pub dag_run_id: String,
    pub queue: Option<String>,
    #[serde(default)]
    pub pool_slots: u64,
    pub queued_when: Option<String>,
    pub start_date: Option<String>,
    pub end_date: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RunTaskInstancePage {
    task_instances: Vec<RunTaskInstance>,
    total_entries: u64,
}

impl RestApiClient {
    /// One page of the DAGs that are not paused (nor stale: their file is gone), from
    /// `offset`, in `dag_id` order.
    pub async fn unpaused_dags_page(&self, offset: u64) -> Result<DagPage, ApiError> {
        let mut url = self.api_url(&["dags"]);
        url.query_pairs_mut()
            .append_pair("paused", "false")
            .append_pair("exclude_stale", "true")
            .append_pair("order_by", "dag_id")
            .append_pair("limit", &PAGE_REQUEST.to_string())
            .append_pair("offset", &offset.to_string());
        self.get_json(call::DAGS, url).await
    }

    /// Every task of `dag_id` (one request: the endpoint does not page).
    pub async fn dag_tasks(&self, dag_id: &str) -> Result<Vec<DagTask>, ApiError> {
        let url = self.api_url(&["dags", dag_id, "tasks"]);
        let answer: DagTasks = self.get_json(call::DAG_TASKS, url).await?;
        Ok(answer.tasks)
    }

    /// The latest `limit` finished (succeeded or failed) runs of `dag_id`, newest first.
    pub async fn finished_dag_runs(
        &self,
        dag_id: &str,
        limit: u32,
    ) -> Result<Vec<ListedDagRun>, ApiError> {
        let mut url = self.api_url(&["dags", dag_id, "dagRuns"]);
        url.query_pairs_mut()
            .append_pair("state", "success")
            .append_pair("state", "failed")
            .append_pair("order_by", "-run_after")
            .append_pair("limit", &limit.to_string());
        let answer: DagRunPage = self.get_json(call::DAG_RUNS, url).await?;
        Ok(answer.dag_runs)
    }

    /// The task instances on any of `queues` of the runs of `dag_id` whose `run_after` is at
    /// or after `run_after_gte`, at most `max_pages` pages of them; `Ok(None)` when there are
    /// more (the caller then learns nothing rather than something partial).
    pub async fn run_task_instances(
        &self,
        dag_id: &str,
        queues: &[String],
        run_after_gte: &str,
        max_pages: u32,
    ) -> Result<Option<Vec<RunTaskInstance>>, ApiError> {
        let mut listed = Vec::new();
        for _ in 0..max_pages {
            let mut url = self.api_url(&["dags", dag_id, "dagRuns", "~", "taskInstances"]);
            {
                let mut query = url.query_pairs_mut();
                for queue in queues {
                    query.append_pair("queue", queue);
                }
                query
                    .append_pair("run_after_gte", run_after_gte)
                    .append_pair("order_by", "id")
                    .append_pair("limit", &PAGE_REQUEST.to_string())
                    .append_pair("offset", &listed.len().to_string());
            }
            let page: RunTaskInstancePage = self.get_json(call::RUN_TASK_INSTANCES, url).await?;
            let got = page.task_instances.len();
            listed.extend(page.task_instances);
            if got == 0 || listed.len() as u64 >= page.total_entries {
                return Ok(Some(listed));
            }
        }
        Ok(None)
    }

    /// `<base>/api/v2/<segments…>`, each segment escaped.
    fn api_url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http(s) base URL always has path segments")
            .extend(["api", "v2"])
            .extend(segments);
        url
    }
}
