//! Client for the Edge Worker API of the edge3 provider (`/edge_worker/v1/…`).
//!
//! Each call mints its own token (see [`crate::edge_token`]) whose `method` claim is the
//! *decoded* path after `/edge_worker/v1/`: the server compares it with the path it routed,
//! after percent-decoding. The URL itself carries percent-encoded segments, because run ids
//! hold characters such as `+` and `:` and dag/task ids may hold anything the UI allows.

use crate::edge_token::EdgeTokenSigner;
use crate::edge_types::{
    EdgeJob, FetchBody, HeartbeatAnswer, JobState, JobStateBody, PushLogsBody, RegisterAnswer,
    TaskKey, WorkerStateBody,
};
use crate::error::{check_status, malformed, send, ApiError, CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use crate::trusted_ca::{trusting, TrustedCa};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::{Duration, Instant};
use url::Url;

/// Names of the Edge API calls, as used in logs and metric labels.
pub mod call {
    pub const REGISTER: &str = "register";
    pub const HEARTBEAT: &str = "heartbeat";
    pub const FETCH: &str = "fetch";
    pub const JOB_STATE: &str = "job_state";
    pub const LOGS_PUSH: &str = "logs_push";
    pub const VERSION: &str = "version";
}

/// Receives the outcome of every call, so the agent can export request metrics without the
/// client knowing about Prometheus.
pub trait CallObserver: Send + Sync {
    fn observe(&self, call: &'static str, elapsed: Duration, ok: bool);
}

/// An observer that records nothing (for the Sentinel and for tests).
pub struct NoObserver;

impl CallObserver for NoObserver {
    fn observe(&self, _: &'static str, _: Duration, _: bool) {}
}

pub struct EdgeClient {
    http: reqwest::Client,
    base: Url,
    signer: EdgeTokenSigner,
    observer: Box<dyn CallObserver>,
}

impl EdgeClient {
    /// `base` is the Edge API base, e.g. `http://airflow:8080/edge_worker/v1`.
    pub fn new(
        base: &Url,
        signer: EdgeTokenSigner,
        observer: Box<dyn CallObserver>,
        ca: Option<&TrustedCa>,
    ) -> Result<Self, reqwest::Error> {
        let mut base = base.clone();
        // Url::join and path_segments_mut treat a trailing slash as an empty last segment.
        if base.path().ends_with('/') {
            let trimmed = base.path().trim_end_matches('/').to_string();
            base.set_path(&trimmed);
        }
        let http = trusting(reqwest::Client::builder(), ca)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("astro-agent/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(EdgeClient {
            http,
            base,
            signer,
            observer,
        })
    }

    /// The Airflow version of the api-server: `GET /api/v2/version` beside the Edge API, which
    /// Airflow 3 answers without credentials; an Airflow 2 answers at `/api/v1/version`
    /// instead. `None` when neither exists there (the Edge API is not at `/edge_worker/v1` under
    /// the api-server's root, or a proxy in front of it serves only the Edge API).
    pub async fn airflow_version(&self) -> Result<Option<String>, ApiError> {
        #[derive(serde::Deserialize)]
        struct VersionInfo {
            version: String,
        }
        let Some(root) = api_server_root(&self.base) else {
            return Ok(None);
        };
        for api in ["v2", "v1"] {
            let mut url = root.clone();
            url.path_segments_mut()
                .expect("an http(s) base URL always has path segments")
                .pop_if_empty()
                .extend(["api", api, "version"]);
            let started = Instant::now();
            let request = self
                .http
                .get(url)
                .header(reqwest::header::ACCEPT, "application/json");
            let answer = match send(call::VERSION, request).await {
                Ok((StatusCode::NOT_FOUND, _)) => Ok(None),
                Ok((status, text)) => decode_answer::<VersionInfo>(call::VERSION, status, &text)
                    .map(|info| Some(info.version)),
                Err(e) => Err(e),
            };
            self.observer
                .observe(call::VERSION, started.elapsed(), answer.is_ok());
            if let Some(version) = answer? {
                return Ok(Some(version));
            }
        }
        Ok(None)
    }

    /// `POST worker/{name}`. A 409 means the name is still marked active on the server.
    pub async fn register(
        &self,
        worker: &str,
        body: &WorkerStateBody,
    ) -> Result<RegisterAnswer, ApiError> {
        self.call(
            call::REGISTER,
            Method::POST,
            &["worker", worker],
            Some(body),
        )
        .await
    }

    /// `PATCH worker/{name}`: the heartbeat, whose answer is authoritative.
    pub async fn heartbeat(
        &self,
        worker: &str,
        body: &WorkerStateBody,
    ) -> Result<HeartbeatAnswer, ApiError> {
        self.call(
            call::HEARTBEAT,
            Method::PATCH,
            &["worker", worker],
            Some(body),
        )
        .await
    }

    /// `POST jobs/fetch/{name}`: `None` when no job is waiting on our queues.
    pub async fn fetch_job(
        &self,
        worker: &str,
        queues: &[String],
        free_concurrency: u32,
    ) -> Result<Option<EdgeJob>, ApiError> {
        let body = FetchBody {
            queues,
            free_concurrency,
            supports_task_instance_uuid: true,
        };
        self.call(
            call::FETCH,
            Method::POST,
            &["jobs", "fetch", worker],
            Some(&body),
        )
        .await
    }

    /// `PATCH jobs/state/{dag}/{task}/{run}/{try}/{map}/{state}`.
    pub async fn set_job_state(&self, key: &TaskKey, state: JobState) -> Result<(), ApiError> {
        let (try_number, map_index) = (key.try_number.to_string(), key.map_index.to_string());
        let mut path = vec!["jobs", "state"];
        path.extend(task_segments(key, &try_number, &map_index));
        path.push(state.as_str());
        let body = JobStateBody {
            task_instance_id: key.task_instance_id.as_deref(),
        };
        self.call::<_, serde_json::Value>(call::JOB_STATE, Method::PATCH, &path, Some(&body))
            .await
            .map(drop)
    }

    /// `POST logs/push/{dag}/{task}/{run}/{try}/{map}` with one chunk of log text.
    pub async fn push_logs(&self, key: &TaskKey, chunk: &str) -> Result<(), ApiError> {
        let (try_number, map_index) = (key.try_number.to_string(), key.map_index.to_string());
        let mut path = vec!["logs", "push"];
        path.extend(task_segments(key, &try_number, &map_index));
        let body = PushLogsBody {
            log_chunk_time: chrono::Utc::now().to_rfc3339(),
            log_chunk_data: chunk,
            task_instance_id: key.task_instance_id.as_deref(),
        };
        self.call::<_, serde_json::Value>(call::LOGS_PUSH, Method::POST, &path, Some(&body))
            .await
            .map(drop)
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        name: &'static str,
        method: Method,
        segments: &[&str],
        body: Option<&B>,
    ) -> Result<T, ApiError> {
        let started = Instant::now();
        let result = self.send(name, method, segments, body).await;
        self.observer
            .observe(name, started.elapsed(), result.is_ok());
        result
    }

    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        name: &'static str,
        method: Method,
        segments: &[&str],
        body: Option<&B>,
    ) -> Result<T, ApiError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http(s) base URL always has path segments")
            .extend(segments);
        let token = self.signer.sign(&segments.join("/"));
        let mut request = self
            .http
            .request(method, url)
            // The edge3 API wants the raw token; a `Bearer ` prefix is refused with 403.
            .header(reqwest::header::AUTHORIZATION, token)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(body) = body {
            request = request.json(body);
        }
        let (status, text) = send(name, request).await?;
        decode_answer(name, status, &text)
    }
}

/// The api-server's answer to `call` as `T`: a non-success status, or a body that is not a
/// `T`, is an [`ApiError`] whose text stays short whatever the body holds. An empty body reads
/// as JSON `null` (e.g. `Option<EdgeJob>` when no job waits).
pub fn decode_answer<T: DeserializeOwned>(
    call: &'static str,
    status: StatusCode,
    text: &str,
) -> Result<T, ApiError> {
    check_status(call, status, text)?;
    let text = if status == StatusCode::NO_CONTENT || text.trim().is_empty() {
        "null"
    } else {
        text
    };
    serde_json::from_str(text).map_err(|e| malformed(call, &e, text))
}

/// The api-server's root for an Edge API base that ends in `/edge_worker/v1`, where the
/// provider mounts it; `None` for any other base, whose root cannot be told.
fn api_server_root(edge_base: &Url) -> Option<Url> {
    let path = edge_base.path().trim_end_matches('/');
    let root = path.strip_suffix("/edge_worker/v1")?;
    let mut url = edge_base.clone();
    url.set_path(root);
    url.set_query(None);
    Some(url)
}

/// The segments that name one try of one task instance: `{dag}/{task}/{run}/{try}/{map}`.
fn task_segments<'a>(key: &'a TaskKey, try_number: &'a str, map_index: &'a str) -> [&'a str; 5] {
    [
        &key.dag_id,
        &key.task_id,
        &key.run_id,
        try_number,
        map_index,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_server_root_is_the_edge_base_without_its_mount_point() {
        let root = |base: &str| api_server_root(&Url::parse(base).unwrap()).map(String::from);
        assert_eq!(
            root("http://airflow:8080/edge_worker/v1").as_deref(),
            Some("http://airflow:8080/")
        );
        assert_eq!(
            root("https://example.com/airflow/edge_worker/v1/").as_deref(),
            Some("https://example.com/airflow")
        );
        assert_eq!(root("http://airflow:8080/somewhere/else"), None);
    }
}
