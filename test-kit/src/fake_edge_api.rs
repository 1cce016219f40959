//! A fake Edge Worker API, to drive the real `astro-agent` binary through slots, drains,
//! signals and server faults in a few seconds.
//!
//! The fake verifies every request's JWT exactly as the edge3 provider does (HS512, `aud`
//! `api`, `method` equal to the decoded path after `/edge_worker/v1/`), so the agent's tests
//! also pin the auth contract.

use crate::server::serve;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The JWT secret the fake shares with the agent under test.
pub const SECRET: &str = "test-secret-test-secret-test-secret-test-secret-test-secret-0123";

/// What the fake Airflow has seen and will answer.
#[derive(Default)]
pub struct State {
    pub queue: VecDeque<Value>,
    /// job id → states reported, in order
    pub states: HashMap<String, Vec<String>>,
    /// job id → concatenated log text pushed
    pub logs: HashMap<String, String>,
    pub heartbeats: Vec<String>,
    pub fetches: u32,
    pub fetch_free: Vec<u32>,
    /// Handed out and not yet reported success/failed.
    pub in_flight: u32,
    pub max_in_flight: u32,
    pub handed_out: Vec<(String, Instant)>,
    pub finished: Vec<(String, Instant)>,
    pub registers: u32,
    pub auth_failures: u32,
    // fault injection
    pub register_conflicts: u32,
    pub fail_fetches: u32,
    pub malformed_fetches: u32,
    pub fail_states: u32,
    pub heartbeat_answer_state: Option<String>,
    /// The queues heartbeats answer with, as when an admin changes a worker's queues.
    pub heartbeat_answer_queues: Option<Vec<String>>,
    /// Answer every log push 500, as edge3 5.1.0 does for an executor callback's log.
    pub refuse_log_pushes: bool,
    /// Log pushes received, accepted or not.
    pub log_pushes: u32,
    /// Answer the next heartbeats 404, as for a worker an admin deleted.
    pub forget_worker: u32,
    /// The api-server is down: every request gets 503 (what a load balancer in front of it
    /// answers).
    pub down: bool,
    /// When each fetch arrived, answered or not.
    pub fetch_attempts: Vec<Instant>,
    // versions, checked as the edge3 provider does when set
    /// Airflow's version: `GET /api/v2/version` answers it, and registrations and heartbeats
    /// reporting another are refused (400, edge3's text). None: no version endpoint, no check.
    pub airflow_version: Option<String>,
    /// The Edge provider's version: registrations and heartbeats reporting another are refused
    /// with edge3's text, which names it. None: no check.
    pub edge_provider_version: Option<String>,
    /// An Airflow 2 answers its version at `/api/v1/version` only.
    pub airflow_2_version: Option<String>,
    /// Answer the next version requests 503.
    pub fail_versions: u32,
    pub version_requests: u32,
    /// The `sysinfo` of every registration and heartbeat, accepted or not.
    pub registered_sysinfo: Vec<Value>,
    pub heartbeat_sysinfo: Vec<Value>,
}

/// The fake's address and a handle on what it has seen; clones share both.
#[derive(Clone)]
pub struct FakeAirflow {
    pub addr: SocketAddr,
    shared: Shared,
}

/// What the fake's handler and the test share: the state, and a wake-up on every change.
#[derive(Clone, Default)]
struct Shared {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl FakeAirflow {
    pub async fn start() -> Self {
        let shared = Shared::default();
        let handler = shared.clone();
        let server = serve(move |req| {
            let handler = handler.clone();
            async move { handler.handle(req).await }
        })
        .await;
        // The fake's clones outlive any one owner, so it serves until the test ends.
        FakeAirflow {
            addr: server.detach(),
            shared,
        }
    }

    pub fn api_url(&self) -> String {
        format!("http://{}/edge_worker/v1", self.addr)
    }

    /// Queues a job whose workload is `command` as given.
    pub fn add_job_with_command(&self, id: &str, command: Value) {
        let job = json!({
            "dag_id": "dag", "task_id": id, "run_id": "manual__2026-11-30T09:00:00+00:00",
            "map_index": -1, "try_number": 1, "concurrency_slots": 1, "task_instance_id": null,
            "command": command
        });
        self.shared.state.lock().unwrap().queue.push_back(job);
        self.shared.changed.notify_waiters();
    }

    /// Queues a job whose fake task sleeps `sleep` seconds and exits with `exit`.
    pub fn add_job(&self, id: &str, sleep: f64, exit: i32) {
        let job = json!({
            "dag_id": "dag", "task_id": id, "run_id": "manual__2026-11-30T09:00:00+00:00",
            "map_index": -1, "try_number": 1, "concurrency_slots": 1, "task_instance_id": null,
            "command": {
                "type": "ExecuteTask", "token": "task-token",
                "log_path": format!("dag_id=dag/{id}.log"),
                "fake": {"sleep": sleep, "exit": exit}
            }
        });
        self.shared.state.lock().unwrap().queue.push_back(job);
        self.shared.changed.notify_waiters();
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.shared.with(f)
    }

    /// Waits until `cond` holds, re-checking on every request the fake serves.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&State) -> bool,
    ) -> Result<(), String> {
        self.shared.wait_until(what, timeout, cond).await
    }
}

impl Shared {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.state.lock().unwrap());
        self.changed.notify_waiters();
        r
    }

    async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&State) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if cond(&self.state.lock().unwrap()) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                if cond(&self.state.lock().unwrap()) {
                    return Ok(());
                }
                return Err(format!("timed out after {timeout:?} waiting for: {what}"));
            }
        }
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let token = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let mut state = self.state.lock().unwrap();
        if path.contains("/jobs/fetch/") {
            state.fetch_attempts.push(Instant::now());
        }
        if state.down {
            drop(state);
            self.changed.notify_waiters();
            let mut response = Response::new(Full::new(Bytes::from("down")));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            return response;
        }
        drop(state);
        if let Some(api) = path
            .strip_prefix("/api/")
            .and_then(|p| p.strip_suffix("/version"))
        {
            let response = self.with(|s| version_answer(s, api));
            return response;
        }
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let rest = path.strip_prefix("/edge_worker/v1/").unwrap_or(&path);
        // Airflow routes on the decoded path (the run id's `:` and `+` arrive encoded).
        let decoded = percent_encoding::percent_decode_str(rest)
            .decode_utf8()
            .unwrap()
            .into_owned();
        if !token_is_valid(&token, &decoded) {
            self.with(|s| s.auth_failures += 1);
            return reply(StatusCode::FORBIDDEN, json!({"detail": "Forbidden"}));
        }
        let parts: Vec<&str> = decoded.split('/').collect();
        let response = {
            let mut s = self.state.lock().unwrap();
            match (method.as_str(), parts.as_slice()) {
                ("POST", ["worker", _]) => {
                    s.registers += 1;
                    s.registered_sysinfo.push(body["sysinfo"].clone());
                    if let Some(refusal) = version_refusal(&s, &body) {
                        refusal
                    } else if s.register_conflicts > 0 {
                        s.register_conflicts -= 1;
                        reply(StatusCode::CONFLICT, json!({"detail": "active"}))
                    } else {
                        reply(
                            StatusCode::OK,
                            json!({"last_update": null, "versions_match": true}),
                        )
                    }
                }
                ("PATCH", ["worker", _]) if s.forget_worker > 0 => {
                    s.forget_worker -= 1;
                    reply(StatusCode::NOT_FOUND, json!({"detail": "Worker not found"}))
                }
                ("PATCH", ["worker", _]) if version_refusal(&s, &body).is_some() => {
                    s.heartbeat_sysinfo.push(body["sysinfo"].clone());
                    version_refusal(&s, &body).unwrap()
                }
                ("PATCH", ["worker", _]) => {
                    s.heartbeat_sysinfo.push(body["sysinfo"].clone());
                    let state = body["state"].as_str().unwrap_or("?").to_string();
                    s.heartbeats.push(state.clone());
                    let answer = s.heartbeat_answer_state.clone().unwrap_or(state);
                    let queues = match &s.heartbeat_answer_queues {
                        Some(queues) => json!(queues),
                        None => body["queues"].clone(),
                    };
                    reply(
                        StatusCode::OK,
                        json!({"state": answer, "queues": queues, "maintenance_comments": null,
                               "concurrency": null, "versions_match": true}),
                    )
                }
                ("POST", ["jobs", "fetch", _]) => {
                    s.fetches += 1;
                    s.fetch_free
                        .push(body["free_concurrency"].as_u64().unwrap_or(0) as u32);
                    assert_eq!(body["supports_task_instance_uuid"], json!(true));
                    if s.fail_fetches > 0 {
                        s.fail_fetches -= 1;
                        reply(StatusCode::INTERNAL_SERVER_ERROR, json!({"detail": "boom"}))
                    } else if s.malformed_fetches > 0 {
                        s.malformed_fetches -= 1;
                        Response::new(Full::new(Bytes::from_static(b"{\"dag_id\": ")))
                    } else if let Some(job) = s.queue.pop_front() {
                        let id = job["task_id"].as_str().unwrap().to_string();
                        s.in_flight += 1;
                        s.max_in_flight = s.max_in_flight.max(s.in_flight);
                        s.handed_out.push((id, Instant::now()));
                        reply(StatusCode::OK, job)
                    } else {
                        reply(StatusCode::OK, Value::Null)
                    }
                }
                ("PATCH", ["jobs", "state", "dag", task, run, "1", "-1", state]) => {
                    assert_eq!(*run, "manual__2026-11-30T09:00:00+00:00");
                    if s.fail_states > 0 {
                        s.fail_states -= 1;
                        reply(StatusCode::SERVICE_UNAVAILABLE, json!({"detail": "later"}))
                    } else {
                        let task = task.to_string();
                        if *state != "running" {
                            s.in_flight -= 1;
                            s.finished.push((task.clone(), Instant::now()));
                        }
                        s.states.entry(task).or_default().push(state.to_string());
                        reply(StatusCode::OK, Value::Null)
                    }
                }
                ("POST", ["logs", "push", "dag", _, _, "1", "-1"]) if s.refuse_log_pushes => {
                    s.log_pushes += 1;
                    reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"detail": "Internal Server Error"}),
                    )
                }
                ("POST", ["logs", "push", "dag", task, _, "1", "-1"]) => {
                    s.log_pushes += 1;
                    let chunk = body["log_chunk_data"].as_str().unwrap_or("").to_string();
                    assert!(chunk.len() <= 512 * 1024);
                    s.logs.entry(task.to_string()).or_default().push_str(&chunk);
                    reply(StatusCode::OK, Value::Null)
                }
                _ => reply(
                    StatusCode::NOT_FOUND,
                    json!({"detail": format!("no route {method} {decoded}")}),
                ),
            }
        };
        self.changed.notify_waiters();
        response
    }
}

/// `GET /api/{api}/version`, public as in Airflow.
fn version_answer(s: &mut State, api: &str) -> Response<Full<Bytes>> {
    s.version_requests += 1;
    if s.fail_versions > 0 {
        s.fail_versions -= 1;
        return reply(StatusCode::SERVICE_UNAVAILABLE, json!({"detail": "later"}));
    }
    let version = match api {
        "v2" => s.airflow_version.clone(),
        "v1" => s.airflow_2_version.clone(),
        _ => None,
    };
    match version {
        Some(version) => reply(
            StatusCode::OK,
            json!({"version": version, "git_version": null}),
        ),
        None => reply(StatusCode::NOT_FOUND, json!({"detail": "Not Found"})),
    }
}

/// The edge3 provider's refusal of a worker whose versions differ from Airflow's (with no
/// `[edge] minimum_acceptable_*_version_for_workers` set), in its words.
fn version_refusal(s: &State, body: &Value) -> Option<Response<Full<Bytes>>> {
    let reported = |field: &str| body["sysinfo"][field].as_str().unwrap_or("").to_string();
    let refuse = |detail: String| Some(reply(StatusCode::BAD_REQUEST, json!({"detail": detail})));
    let airflow = reported("airflow_version");
    if s.airflow_version.as_ref().is_some_and(|v| *v != airflow) {
        return refuse(format!("Edge Worker runs on Airflow {airflow} which is below the minimum acceptable version None. Rejecting access due to incompatible version."));
    }
    let edge = reported("edge_provider_version");
    match &s.edge_provider_version {
        Some(core) if *core != edge => refuse(format!("Edge Worker runs on Edge Provider {edge} and the core runs on {core}. Rejecting access due to difference.")),
        _ => None,
    }
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r
}

fn token_is_valid(token: &str, method: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Claims {
        method: String,
    }
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS512);
    validation.set_audience(&["api"]);
    validation.set_required_spec_claims(&["exp", "nbf", "iat", "aud"]);
    match jsonwebtoken::decode::<Claims>(
        token,
        &jsonwebtoken::DecodingKey::from_secret(SECRET.as_bytes()),
        &validation,
    ) {
        Ok(data) => data.claims.method == method,
        Err(_) => false,
    }
}
