//! Task-instance counts per queue and state from Airflow's public REST API v2.
//!
//! `GET /api/v2/dags/~/dagRuns/~/taskInstances?queue=Q&state=S&limit=0` answers
//! `total_entries` without listing anything, which is the cheapest count the API offers.
//! Authentication is a bearer token, either given as is or obtained from `/auth/token` with a
//! username and password and obtained again whenever the server answers 401.

use crate::edge_worker_list::ListedEdgeWorker;
use crate::error::{check_status, malformed, send, ApiError, CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use crate::secret_file::SecretError;
use crate::trusted_ca::{trusting, TrustedCa};
use serde::Deserialize;
use std::collections::HashMap;
use tokio::sync::Mutex;
use url::Url;

/// How the client proves who it is to the REST API.
#[derive(Clone)]
pub enum RestCredentials {
    /// A bearer token used as is (it cannot be renewed by the client).
    Token(String),
    /// Exchanged at `POST /auth/token` for a bearer token, again on every 401.
    Password { username: String, password: String },
}

impl std::fmt::Debug for RestCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestCredentials::Token(_) => f.write_str("Token(<hidden>)"),
            RestCredentials::Password { username, .. } => {
                write!(
                    f,
                    "Password {{ username: {username:?}, password: <hidden> }}"
                )
            }
        }
    }
}

/// What a binary calls the credential settings, so that an error names the one to change.
#[derive(Debug, Clone, Copy)]
pub struct CredentialNames {
    pub token: &'static str,
    pub username: &'static str,
    pub password: &'static str,
    /// The setting that turns the REST API on, e.g. `--rest-api-url`.
    pub needed_by: &'static str,
}

impl RestCredentials {
    /// A token, or a username with its password: one of the two, never a mix, so that nobody
    /// wonders which one is used. Empty values count as not given.
    pub fn from_given(
        token: Option<String>,
        username: Option<String>,
        password: Option<String>,
        names: CredentialNames,
    ) -> Result<Self, SecretError> {
        let given = |v: Option<String>| v.filter(|v| !v.is_empty());
        let err = |flag, problem: String| SecretError { flag, problem };
        match (given(token), given(username), given(password)) {
            (Some(token), None, None) => Ok(RestCredentials::Token(token)),
            (None, Some(username), Some(password)) => {
                Ok(RestCredentials::Password { username, password })
            }
            (Some(_), _, _) => Err(err(
                names.token,
                "give either a token or a username and password, not both".into(),
            )),
            (None, Some(_), None) => Err(err(
                names.password,
                format!("is required with {}", names.username),
            )),
            (None, None, _) => Err(err(
                names.token,
                format!(
                    "{} needs {}, or {} and {}",
                    names.needed_by, names.token, names.username, names.password
                ),
            )),
        }
    }
}

/// Queued and running task instances on one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueCounts {
    pub queued: u64,
    pub running: u64,
}

pub mod call {
    pub const LOGIN: &str = "rest_login";
    pub const COUNT: &str = "rest_count";
    pub const RUNNING: &str = "rest_running";
    pub const EDGE_WORKERS: &str = "rest_edge_workers";
    pub const FIRST_STARTS: &str = "rest_first_starts";
    pub const LIST: &str = "rest_list";
    pub const DAGS: &str = "rest_dags";
    pub const DAG_TASKS: &str = "rest_dag_tasks";
    pub const DAG_RUNS: &str = "rest_dag_runs";
    pub const RUN_TASK_INSTANCES: &str = "rest_run_task_instances";
}

/// Task instances asked for per page. Airflow answers at most its `[api] maximum_page_limit`
/// (100 by default) whatever is asked, so callers step by the length of the page they got: a
/// server configured for larger pages is read in fewer requests.
pub const PAGE_REQUEST: u64 = 1000;

pub struct RestApiClient {
    http: reqwest::Client,
    pub(crate) base: Url,
    credentials: RestCredentials,
    /// The bearer token in use; `None` until the first login (password credentials).
    token: Mutex<Option<String>>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
}

#[derive(Deserialize)]
struct CountAnswer {
    total_entries: u64,
}

/// One page of `GET .../taskInstances`.
#[derive(Debug, Deserialize)]
pub struct TaskInstancePage {
    pub task_instances: Vec<ListedTaskInstance>,
    /// Task instances matching the filter in all pages.
    pub total_entries: u64,
}

#[derive(Deserialize)]
struct EdgeWorkerPage {
    workers: Vec<ListedEdgeWorker>,
}

/// The fields of a listed task instance that the backlog needs.
#[derive(Debug, Clone, Deserialize)]
pub struct ListedTaskInstance {
    pub id: String,
    pub state: Option<String>,
    pub hostname: Option<String>,
    /// Worker slots the task takes (the Edge job's `concurrency_slots`).
    #[serde(default)]
    pub pool_slots: u64,
    /// When the scheduler queued it (RFC 3339).
    pub queued_when: Option<String>,
    /// When the task started running (RFC 3339, Airflow's clock); `None` before it has.
    #[serde(default)]
    pub start_date: Option<String>,
}

impl RestApiClient {
    /// `base` is the api-server's root, e.g. `http://airflow:8080`; `user_agent` names the
    /// program in Airflow's access log (`astro-agent/<version>`, `astro-sentinel/<version>`).
    pub fn new(
        base: &Url,
        credentials: RestCredentials,
        user_agent: &str,
        ca: Option<&TrustedCa>,
    ) -> Result<Self, reqwest::Error> {
        let http = trusting(reqwest::Client::builder(), ca)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(user_agent)
            .build()?;
        let token = match &credentials {
            RestCredentials::Token(t) => Some(t.clone()),
            RestCredentials::Password { .. } => None,
        };
        let mut base = base.clone();
        if base.path().ends_with('/') {
            let trimmed = base.path().trim_end_matches('/').to_string();
            base.set_path(&trimmed);
        }
        Ok(RestApiClient {
            http,
            base,
            credentials,
            token: Mutex::new(token),
        })
    }

    /// Queued and running counts of one queue, in two requests: queued + running together,
    /// then queued alone. The sum (the backlog autoscaling reads) is exact as of the first
    /// request; only the split can be off by the tasks that started in between. Asking for each
    /// state on its own could count a task that moves from queued to running in between twice.
    pub async fn queue_counts(&self, queue: &str) -> Result<QueueCounts, ApiError> {
        let backlog = self.count(queue, &["queued", "running"]).await?;
        let queued = self.count(queue, &["queued"]).await?.min(backlog);
        Ok(QueueCounts {
            queued,
            running: backlog - queued,
        })
    }

    /// The number of task instances on `queue` in any of `states`, over all DAGs and runs.
    pub async fn count(&self, queue: &str, states: &[&str]) -> Result<u64, ApiError> {
        let mut url = self.task_instances_url();
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("queue", queue);
            for state in states {
                query.append_pair("state", state);
            }
            query.append_pair("limit", "0");
        }
        let answer: CountAnswer = self.get_json(call::COUNT, url).await?;
        Ok(answer.total_entries)
    }

    /// Task slots (Σ `pool_slots`) of the task instances running on any of `queues`, by the
    /// hostname of the worker running them (an Edge worker's hostname: its pod's name).
    /// Pages through the list in `id` order.
    pub async fn running_slots_by_host(
        &self,
        queues: &[String],
    ) -> Result<HashMap<String, u64>, ApiError> {
        let mut slots: HashMap<String, u64> = HashMap::new();
        let mut offset = 0u64;
        loop {
            let page = self
                .page(call::RUNNING, queues, &["running"], offset)
                .await?;
            let listed = page.task_instances.len() as u64;
            for ti in page.task_instances {
                if let Some(host) = ti.hostname.filter(|h| !h.is_empty()) {
                    *slots.entry(host).or_default() += ti.pool_slots.max(1);
                }
            }
            offset += listed;
            if listed == 0 || offset >= page.total_entries {
                return Ok(slots);
            }
        }
    }

    /// The earliest `start_date` (RFC 3339) of the task instances on any of `queues` that
    /// started at or after `since` (RFC 3339), by hostname, for the hostnames in `hosts` only.
    /// Started task instances are listed oldest first, so the first one of a host is its
    /// first task; the listing is bounded by `since`, not by how many tasks the queues ran.
    pub async fn first_starts_by_host(
        &self,
        queues: &[String],
        hosts: &[String],
        since: &str,
    ) -> Result<HashMap<String, String>, ApiError> {
        let mut first: HashMap<String, String> = HashMap::new();
        let mut offset = 0u64;
        loop {
            let mut url = self.task_instances_url();
            {
                let mut query = url.query_pairs_mut();
                for queue in queues {
                    query.append_pair("queue", queue);
                }
                query.append_pair("start_date_gte", since);
                query.append_pair("order_by", "start_date");
                query.append_pair("limit", &PAGE_REQUEST.to_string());
                query.append_pair("offset", &offset.to_string());
            }
            let page: TaskInstancePage = self.get_json(call::FIRST_STARTS, url).await?;
            let listed = page.task_instances.len() as u64;
            for ti in page.task_instances {
                if let (Some(host), Some(start)) = (ti.hostname, ti.start_date) {
                    if hosts.contains(&host) {
                        first.entry(host).or_insert(start);
                    }
                }
            }
            offset += listed;
            if listed == 0 || offset >= page.total_entries || first.len() == hosts.len() {
                return Ok(first);
            }
        }
    }

    /// Every Edge worker Airflow knows, from the edge3 provider's UI API (one request; it
    /// needs the `JOBS` view permission that Airflow's Viewer role has).
    pub async fn edge_workers(&self) -> Result<Vec<ListedEdgeWorker>, ApiError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http(s) base URL always has path segments")
            .extend(["edge_worker", "ui", "worker"]);
        let page: EdgeWorkerPage = self.get_json(call::EDGE_WORKERS, url).await?;
        Ok(page.workers)
    }

    /// The task instances on any of `queues` in any of `states`, in `id` order, from `offset`:
    /// up to [`PAGE_REQUEST`], or the server's page limit if that is lower.
    pub async fn task_instances_page(
        &self,
        queues: &[String],
        states: &[&str],
        offset: u64,
    ) -> Result<TaskInstancePage, ApiError> {
        self.page(call::LIST, queues, states, offset).await
    }

    async fn page(
        &self,
        call: &'static str,
        queues: &[String],
        states: &[&str],
        offset: u64,
    ) -> Result<TaskInstancePage, ApiError> {
        let mut url = self.task_instances_url();
        {
            let mut query = url.query_pairs_mut();
            for queue in queues {
                query.append_pair("queue", queue);
            }
            for state in states {
                query.append_pair("state", state);
            }
            query.append_pair("order_by", "id");
            query.append_pair("limit", &PAGE_REQUEST.to_string());
            query.append_pair("offset", &offset.to_string());
        }
        self.get_json(call, url).await
    }

    fn task_instances_url(&self) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http(s) base URL always has path segments")
            .extend(["api", "v2", "dags", "~", "dagRuns", "~", "taskInstances"]);
        url
    }

    /// GET `url` with the bearer token and decode the JSON answer; with a password, a 401
    /// means the token expired or the server's secret rotated: log in again once.
    pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        call: &'static str,
        url: Url,
    ) -> Result<T, ApiError> {
        let mut renewed = false;
        loop {
            let token = self.current_token().await?;
            let request = self.http.get(url.clone()).bearer_auth(&token);
            let (status, text) = send(call, request).await?;
            // With a fixed token there is nothing to renew.
            if status == reqwest::StatusCode::UNAUTHORIZED
                && !renewed
                && matches!(self.credentials, RestCredentials::Password { .. })
            {
                self.forget_token(&token).await;
                renewed = true;
                continue;
            }
            check_status(call, status, &text)?;
            return serde_json::from_str(&text).map_err(|e| malformed(call, &e, &text));
        }
    }

    async fn current_token(&self) -> Result<String, ApiError> {
        let mut guard = self.token.lock().await;
        if let Some(token) = guard.as_ref() {
            return Ok(token.clone());
        }
        let RestCredentials::Password { username, password } = &self.credentials else {
            unreachable!("a fixed token is set at construction and never forgotten")
        };
        let token = self.login(username, password).await?;
        *guard = Some(token.clone());
        Ok(token)
    }

    /// Drops `stale` unless another caller already replaced it.
    async fn forget_token(&self, stale: &str) {
        let mut guard = self.token.lock().await;
        if guard.as_deref() == Some(stale) {
            *guard = None;
        }
    }

    async fn login(&self, username: &str, password: &str) -> Result<String, ApiError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http(s) base URL always has path segments")
            .extend(["auth", "token"]);
        let request = self
            .http
            .post(url)
            .json(&serde_json::json!({"username": username, "password": password}));
        let (status, text) = send(call::LOGIN, request).await?;
        check_status(call::LOGIN, status, &text)?;
        let answer: TokenAnswer = serde_json::from_str(&text).map_err(|e| ApiError::Malformed {
            call: call::LOGIN,
            // Not even the parser's message: it may quote the token.
            reason: format!(
                "not a token answer ({:?} error at line {} column {}; the answer is not shown)",
                e.classify(),
                e.line(),
                e.column()
            ),
        })?;
        Ok(answer.access_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: CredentialNames = CredentialNames {
        token: "--token",
        username: "--user",
        password: "--password",
        needed_by: "--url",
    };

    fn given(token: &str, username: &str, password: &str) -> Result<RestCredentials, SecretError> {
        let some = |v: &str| Some(v.to_string());
        RestCredentials::from_given(some(token), some(username), some(password), NAMES)
    }

    #[test]
    fn a_token_or_a_username_with_its_password() {
        assert!(matches!(given("t", "", ""), Ok(RestCredentials::Token(t)) if t == "t"));
        assert!(matches!(
            given("", "u", "p"),
            Ok(RestCredentials::Password { username, password }) if username == "u" && password == "p"
        ));
    }

    #[test]
    fn anything_else_names_the_setting_to_change() {
        for (token, username, password, flag) in [
            ("t", "u", "p", "--token"),
            ("t", "", "p", "--token"),
            ("t", "u", "", "--token"),
            ("", "u", "", "--password"),
            ("", "", "p", "--token"),
            ("", "", "", "--token"),
        ] {
            let e = given(token, username, password).unwrap_err();
            assert_eq!(e.flag, flag, "{token:?} {username:?} {password:?}: {e:?}");
        }
        assert_eq!(
            given("", "", "").unwrap_err().problem,
            "--url needs --token, or --user and --password"
        );
    }
}
