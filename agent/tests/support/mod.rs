//! A fake Edge Worker API and a fake task supervisor, to drive the real `astro-agent` binary
//! through slots, drains, signals and server faults in a few seconds.
//!
//! The fake verifies every request's JWT exactly as the edge3 provider does (HS512, `aud`
//! `api`, `method` equal to the decoded path after `/edge_worker/v1/`), so these tests also
//! pin the auth contract.

#![allow(dead_code)] // each test binary uses a different part of the support code

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Notify;

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
    /// Answer the next heartbeats 404, as for a worker an admin deleted.
    pub forget_worker: u32,
    /// The api-server is down: every request gets 503 (what a load balancer in front of it
    /// answers).
    pub down: bool,
    /// When each fetch arrived, answered or not.
    pub fetch_attempts: Vec<Instant>,
}

#[derive(Clone)]
pub struct FakeAirflow {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl FakeAirflow {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = FakeAirflow {
            addr,
            state: Arc::new(Mutex::new(State::default())),
            changed: Arc::new(Notify::new()),
        };
        let server = fake.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let server = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let server = server.clone();
                        async move { Ok::<_, std::convert::Infallible>(server.handle(req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        fake
    }

    pub fn api_url(&self) -> String {
        format!("http://{}/edge_worker/v1", self.addr)
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
        self.state.lock().unwrap().queue.push_back(job);
        self.changed.notify_waiters();
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.state.lock().unwrap());
        self.changed.notify_waiters();
        r
    }

    /// Waits until `cond` holds, re-checking on every request the fake serves.
    pub async fn wait_until(
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
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let rest = path.strip_prefix("/edge_worker/v1/").unwrap_or(&path);
        let decoded = percent_decode(rest);
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
                    if s.register_conflicts > 0 {
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
                ("PATCH", ["worker", _]) => {
                    let state = body["state"].as_str().unwrap_or("?").to_string();
                    s.heartbeats.push(state.clone());
                    let answer = s.heartbeat_answer_state.clone().unwrap_or(state);
                    reply(
                        StatusCode::OK,
                        json!({"state": answer, "queues": body["queues"], "maintenance_comments": null,
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
                ("POST", ["logs", "push", "dag", task, _, "1", "-1"]) => {
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

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
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

/// A fake `python` that plays Airflow's supervisor: it reads `fake.sleep` and `fake.exit`
/// from the workload file, writes the task log, and reports SIGTERM in it. Each one also
/// leaves a file in `running/` while it runs and appends how many it saw there (itself
/// included) to `concurrency`: the largest number is the most task processes at once.
pub fn fake_python(dir: &Path) -> PathBuf {
    let path = dir.join("python");
    std::fs::write(
        &path,
        r#"#!/bin/sh
f="$4"
secs=$(sed -n 's/.*"sleep":\([0-9.]*\).*/\1/p' "$f")
code=$(sed -n 's/.*"exit":\([0-9]*\).*/\1/p' "$f")
log="$AIRFLOW__LOGGING__BASE_LOG_FOLDER/$(sed -n 's/.*"log_path":"\([^"]*\)".*/\1/p' "$f")"
here="$(dirname "$0")"
mkdir -p "$(dirname "$log")" "$here/running"
touch "$here/running/$$"
ls "$here/running" | wc -l >> "$here/concurrency"
echo "task started on $HOSTNAME" >> "$log"
trap 'echo "task got SIGTERM" >> "$log"; rm -f "$here/running/$$"; exit 143' TERM
sleep "$secs" & wait $!
echo "task done" >> "$log"
rm -f "$here/running/$$"
exit "$code"
"#,
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The most task processes the fake `python` in `dir` saw running at once.
pub fn max_task_processes(dir: &Path) -> u32 {
    std::fs::read_to_string(dir.join("concurrency"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|n| n.parse::<u32>().unwrap())
        .max()
        .unwrap_or(0)
}

pub struct Agent {
    pub child: tokio::process::Child,
    pub metrics_addr: SocketAddr,
    pub stderr_path: PathBuf,
}

/// Starts the real binary against `fake` with `extra` flags.
pub async fn start_agent(fake: &FakeAirflow, dir: &Path, extra: &[&str]) -> Agent {
    start_agent_with_env(fake, dir, extra, &[]).await
}

/// [`start_agent`], with `env` set last (over the defaults).
pub async fn start_agent_with_env(
    fake: &FakeAirflow,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Agent {
    let port = free_port();
    let metrics_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let stderr_path = dir.join(format!("agent-{port}.log"));
    let python = fake_python(dir);
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_astro-agent"));
    cmd.args(["--api-url", &fake.api_url()])
        .args(["--execution-api-url", "http://127.0.0.1:1/execution/"])
        .args(["--worker-name", "agent-under-test"])
        .args(["--listen", &metrics_addr.to_string()])
        .args(["--log-folder", dir.join("logs").to_str().unwrap()])
        .args([
            "--airflow-version",
            "3.3.2",
            "--edge-provider-version",
            "5.1.0",
        ])
        .args(extra)
        // Defaults through the environment, so that `extra` flags can override them.
        .env("ASTRO_AGENT_HEARTBEAT_INTERVAL", "1s")
        .env("ASTRO_AGENT_IDLE_FETCH_INTERVAL", "200ms")
        .env("ASTRO_AGENT_PYTHON", &python)
        // The fake supervisor is a shell script; the pre-fork launcher has tests of its own.
        .env("ASTRO_AGENT_LAUNCH_MODE", "fresh")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .kill_on_drop(true);
    // The secret as an environment variable unless the test gives its file (both: exit 2).
    if !extra.contains(&"--jwt-secret-file") {
        cmd.env("ASTRO_AGENT_JWT_SECRET", SECRET);
    }
    let child = cmd.spawn().unwrap();
    Agent {
        child,
        metrics_addr,
        stderr_path,
    }
}

impl Agent {
    /// [`FakeAirflow::wait_until`], failing with the agent's log.
    pub async fn until(
        &self,
        fake: &FakeAirflow,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&State) -> bool,
    ) {
        if let Err(e) = fake.wait_until(what, timeout, cond).await {
            panic!("{e}\nagent log:\n{}", self.log());
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    pub async fn exit_code(&mut self, timeout: Duration) -> i32 {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "agent did not exit within {timeout:?}; log:\n{}",
                    self.log()
                )
            })
            .unwrap();
        status.code().expect("agent exited by a signal")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// GET a path on the agent's admin port; (status, body).
    pub async fn get(&self, path: &str) -> (u16, String) {
        let url = format!("http://{}{path}", self.metrics_addr);
        raw_get(&url).await.unwrap_or_default()
    }
}

async fn raw_get(url: &str) -> Option<(u16, String)> {
    // A tiny HTTP/1.0 GET over TcpStream keeps the test free of an HTTP client dependency.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}")))?;
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status: u16 = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
