//! Test helpers: a fake Airflow REST API, a fake Kubernetes API server, a client that calls
//! exactly as KEDA's metrics-api scaler does, and a way to start a Sentinel in-process.
#![allow(dead_code)]

use astro_sentinel::app::{self, Running};
use astro_sentinel::config::file::Config;
use astro_sentinel::config::flags::KubernetesAccess;
use astro_sentinel::metrics::Metrics;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A minimal HTTP server answering with `handler`; stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

pub async fn serve<F, Fut>(handler: F) -> TestServer
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, mut stopped) = watch::channel(false);
    let handler = Arc::new(handler);
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                s = listener.accept() => match s { Ok((s, _)) => s, Err(_) => continue },
                _ = stopped.changed() => return,
            };
            let handler = handler.clone();
            let mut conn_stopped = stopped.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(req).await) }
                });
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = conn_stopped.changed() => {}
                }
            });
        }
    });
    TestServer { addr, stop }
}

pub fn json_response(status: u16, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

fn query_params(req: &Request<Incoming>) -> HashMap<String, String> {
    url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// A fake Airflow REST API v2: lists the task instances of one queue in some states,
/// `GET /api/v2/dags/~/dagRuns/~/taskInstances?queue=Q&state=S&order_by=id&limit=N&offset=M`,
/// at most [`FAKE_PAGE_LIMIT`] a page as Airflow's default `maximum_page_limit` does.
#[derive(Default)]
pub struct FakeAirflow {
    instances: Mutex<HashMap<String, Vec<FakeInstance>>>,
    failing: Mutex<HashSet<String>>,
    hanging: Mutex<HashSet<String>>,
    slow: Mutex<HashMap<String, Duration>>,
    /// Queues whose pages come back empty while `total_entries` still counts them.
    unlisted: Mutex<HashSet<String>>,
    pub requests: AtomicUsize,
    pub token: Mutex<String>,
    /// The User-Agent of the last request.
    pub user_agent: Mutex<String>,
}

impl FakeAirflow {
    /// `queued` and `running` task instances of one slot each on `queue`.
    pub fn set(&self, queue: &str, queued: u64, running: u64) {
        let listed = (0..queued)
            .map(|_| FakeInstance::queued(1, "2024-01-01T00:00:00Z"))
            .chain((0..running).map(|_| FakeInstance::running(1)))
            .collect();
        self.set_instances(queue, listed);
    }

    /// Exactly these task instances on `queue`, in `id` order.
    pub fn set_instances(&self, queue: &str, listed: Vec<FakeInstance>) {
        self.instances.lock().unwrap().insert(queue.into(), listed);
    }

    /// Makes `queue` answer 500 (`true`) or normally again (`false`).
    pub fn fail(&self, queue: &str, failing: bool) {
        let mut f = self.failing.lock().unwrap();
        if failing {
            f.insert(queue.into());
        } else {
            f.remove(queue);
        }
    }

    /// Makes requests for `queue` wait (practically) forever: an api-server that accepted the
    /// connection but never answers.
    pub fn hang(&self, queue: &str) {
        self.hanging.lock().unwrap().insert(queue.into());
    }

    /// Makes every answer for `queue` take `delay`.
    pub fn slow(&self, queue: &str, delay: Duration) {
        self.slow.lock().unwrap().insert(queue.into(), delay);
    }

    /// Makes `queue` count its task instances but list none (a server that only counts).
    pub fn list_nothing(&self, queue: &str) {
        self.unlisted.lock().unwrap().insert(queue.into());
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub async fn start(self: &Arc<Self>) -> TestServer {
        let me = self.clone();
        serve(move |req| {
            let me = me.clone();
            async move {
                let queue = query_params(&req).get("queue").cloned().unwrap_or_default();
                if me.hanging.lock().unwrap().contains(&queue) {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                let delay = me.slow.lock().unwrap().get(&queue).copied();
                if let Some(delay) = delay {
                    tokio::time::sleep(delay).await;
                }
                me.answer(req)
            }
        })
        .await
    }

    fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.uri().path() != "/api/v2/dags/~/dagRuns/~/taskInstances" {
            return json_response(404, serde_json::json!({"detail": "Not Found"}));
        }
        self.requests.fetch_add(1, Ordering::SeqCst);
        *self.user_agent.lock().unwrap() = req
            .headers()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let expected = format!("Bearer {}", self.token.lock().unwrap());
        let auth = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if auth != Some(expected.as_str()) {
            return json_response(401, serde_json::json!({"detail": "Not authenticated"}));
        }
        let q = query_params(&req);
        // Several `state` parameters count the task instances in any of them, as Airflow does.
        let states: Vec<String> =
            url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                .filter(|(k, _)| k == "state")
                .map(|(_, v)| v.into_owned())
                .collect();
        let (Some(queue), false) = (q.get("queue"), states.is_empty()) else {
            return json_response(
                400,
                serde_json::json!({"detail": "queue and state required"}),
            );
        };
        if q.get("order_by").map(String::as_str) != Some("id") {
            return json_response(400, serde_json::json!({"detail": "expected order_by=id"}));
        }
        let number = |key: &str| q.get(key).and_then(|v| v.parse::<usize>().ok());
        let (Some(limit), Some(offset)) = (number("limit"), number("offset")) else {
            return json_response(
                400,
                serde_json::json!({"detail": "limit and offset required"}),
            );
        };
        if self.failing.lock().unwrap().contains(queue) {
            return json_response(500, serde_json::json!({"detail": "Internal Server Error"}));
        }
        let instances = self.instances.lock().unwrap();
        let matching: Vec<serde_json::Value> = instances
            .get(queue)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter(|(_, ti)| states.iter().any(|s| s == ti.state))
            .map(|(i, ti)| {
                serde_json::json!({
                    "id": format!("{queue}-{i:06}"),
                    "state": ti.state,
                    "hostname": ti.hostname,
                    "pool_slots": ti.pool_slots,
                    "queue": queue,
                    "queued_when": ti.queued_when,
                })
            })
            .collect();
        let listed = if self.unlisted.lock().unwrap().contains(queue) {
            0
        } else {
            limit.min(FAKE_PAGE_LIMIT)
        };
        let page: Vec<_> = matching.iter().skip(offset).take(listed).cloned().collect();
        json_response(
            200,
            serde_json::json!({"task_instances": page, "total_entries": matching.len()}),
        )
    }
}

/// The most task instances the fake lists in one answer (Airflow's default
/// `[api] maximum_page_limit`).
pub const FAKE_PAGE_LIMIT: usize = 100;

/// One task instance of the fake Airflow.
#[derive(Debug, Clone)]
pub struct FakeInstance {
    pub state: &'static str,
    pub pool_slots: u64,
    pub queued_when: Option<String>,
    pub hostname: Option<String>,
}

impl FakeInstance {
    pub fn queued(pool_slots: u64, queued_when: &str) -> Self {
        FakeInstance {
            state: "queued",
            pool_slots,
            queued_when: Some(queued_when.into()),
            hostname: None,
        }
    }

    pub fn running(pool_slots: u64) -> Self {
        FakeInstance {
            state: "running",
            pool_slots,
            queued_when: Some("2024-01-01T00:00:00Z".into()),
            hostname: Some("worker-0".into()),
        }
    }
}

/// A fake Kubernetes API server that answers TokenReviews from a table of tokens.
/// What a TokenRequest without audiences gets, and what a review without audiences checks.
pub const API_SERVER_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

pub struct FakeKubernetes {
    /// token → username; tokens not in the table are not authenticated.
    pub users: Mutex<HashMap<String, String>>,
    /// token → the audiences it was minted for; absent: the API server's own.
    pub token_audiences: Mutex<HashMap<String, Vec<String>>>,
    /// Answer like an API server that does not know audiences (none in the status).
    pub ignores_audiences: AtomicBool,
    /// The `spec.audiences` of each review, in order.
    pub asked_audiences: Mutex<Vec<Vec<String>>>,
    /// The bearer token the Sentinel must present as itself.
    pub own_token: String,
    pub reviews: AtomicUsize,
    /// The tokens reviewed, in order (to check the request body).
    pub seen: Mutex<Vec<String>>,
    /// Answer this status instead of a review (e.g. 500 or 403).
    pub broken: Mutex<Option<u16>>,
    /// While `false`, reviews are received (and counted) but not answered.
    pub answering: watch::Sender<bool>,
}

impl FakeKubernetes {
    pub fn new(own_token: &str) -> Arc<Self> {
        Arc::new(FakeKubernetes {
            users: Mutex::new(HashMap::new()),
            token_audiences: Mutex::new(HashMap::new()),
            ignores_audiences: AtomicBool::new(false),
            asked_audiences: Mutex::new(Vec::new()),
            own_token: own_token.into(),
            reviews: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            broken: Mutex::new(None),
            answering: watch::Sender::new(true),
        })
    }

    pub fn reviews(&self) -> usize {
        self.reviews.load(Ordering::SeqCst)
    }

    pub async fn start(self: &Arc<Self>) -> TestServer {
        let me = self.clone();
        serve(move |req| {
            let me = me.clone();
            async move { me.answer(req).await }
        })
        .await
    }

    pub async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.method() != hyper::Method::POST
            || req.uri().path() != "/apis/authentication.k8s.io/v1/tokenreviews"
        {
            return json_response(404, serde_json::json!({"kind": "Status", "code": 404}));
        }
        self.reviews.fetch_add(1, Ordering::SeqCst);
        let _ = self
            .answering
            .subscribe()
            .wait_for(|answering| *answering)
            .await;
        let own = format!("Bearer {}", self.own_token);
        if req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            != Some(own.as_str())
        {
            return json_response(401, serde_json::json!({"kind": "Status", "code": 401}));
        }
        if let Some(code) = *self.broken.lock().unwrap() {
            return json_response(code, serde_json::json!({"kind": "Status", "code": code}));
        }
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(review["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(review["kind"], "TokenReview");
        let token = review["spec"]["token"].as_str().unwrap().to_string();
        self.seen.lock().unwrap().push(token.clone());
        let asked: Vec<String> =
            serde_json::from_value(review["spec"]["audiences"].clone()).unwrap_or_default();
        self.asked_audiences.lock().unwrap().push(asked.clone());
        // Like kube-apiserver: the review's audiences (the API server's own when none) must meet
        // the token's; the status names the ones they share.
        let wanted = if asked.is_empty() || self.ignores_audiences.load(Ordering::SeqCst) {
            vec![API_SERVER_AUDIENCE.to_string()]
        } else {
            asked
        };
        let minted_for = self
            .token_audiences
            .lock()
            .unwrap()
            .get(&token)
            .cloned()
            .unwrap_or_else(|| vec![API_SERVER_AUDIENCE.to_string()]);
        let shared: Vec<&String> = wanted.iter().filter(|a| minted_for.contains(a)).collect();
        let status = match self.users.lock().unwrap().get(&token) {
            Some(user) if !shared.is_empty() => {
                let mut status = serde_json::json!({
                    "authenticated": true,
                    "user": {"username": user, "uid": "1234", "groups": ["system:serviceaccounts"]},
                });
                if !self.ignores_audiences.load(Ordering::SeqCst) {
                    status["audiences"] = serde_json::json!(shared);
                }
                status
            }
            Some(_) => serde_json::json!({
                "authenticated": false,
                "error": format!("token audiences {minted_for:?} is invalid for the target audiences {wanted:?}"),
            }),
            None => serde_json::json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        json_response(
            201,
            serde_json::json!({
                "kind": "TokenReview",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": null},
                "spec": {"token": token},
                "status": status,
            }),
        )
    }
}

/// A token shaped like a Kubernetes service-account token (three base64url segments) that no
/// API server issued, a different one for each `seed`.
pub fn jwt_shaped(seed: &str) -> String {
    use sha2::{Digest, Sha256};
    let hex = |part: &str| -> String {
        Sha256::digest(format!("{part} {seed}").as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    format!(
        "eyJhbGciOiJSUzI1NiJ9.eyJ{}.{}",
        hex("payload"),
        hex("signature")
    )
}

/// An HTTP answer as a client sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `request` (raw bytes) on a fresh connection and reads the whole answer.
pub async fn raw_request(addr: SocketAddr, request: &str) -> Answer {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.unwrap();
    parse_answer(&buf)
}

pub fn parse_answer(buf: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

/// `GET path` exactly as KEDA's metrics-api scaler sends it: Go's default User-Agent, a
/// bearer token, gzip accepted, and no Accept header.
pub async fn keda_get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> Answer {
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    raw_request(
        addr,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: Go-http-client/1.1\r\n{auth}Accept-Encoding: gzip\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
}

/// The value at a GJSON-style dotted path (what KEDA's `valueLocation` is), as KEDA would
/// take it: a JSON number.
pub fn value_at(answer: &Answer, path: &str) -> f64 {
    let mut v = answer.json();
    for part in path.split('.') {
        v = v[part].take();
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {}", answer.body))
}

/// Polls `check` until it returns `Some`, failing after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A temp folder removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "astro-sentinel-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn file(&self, name: &str, content: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, content).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts a Sentinel on 127.0.0.1:0 reading `fake` with token `airflow-token`.
pub async fn start_against(
    fake_addr: SocketAddr,
    yaml_rest: &str,
    kubernetes: Option<KubernetesAccess>,
) -> Running {
    try_start_against(fake_addr, yaml_rest, kubernetes)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`start_against`], returning why the Sentinel did not start.
pub async fn try_start_against(
    fake_addr: SocketAddr,
    yaml_rest: &str,
    kubernetes: Option<KubernetesAccess>,
) -> Result<Running, app::StartError> {
    let yaml = format!(
        "source:\n  type: airflow-api\n  airflowApi:\n    url: http://{fake_addr}\n{yaml_rest}"
    );
    let config = Config::parse(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let metrics = Arc::new(Metrics::new());
    let source = app::build_source(
        &astro_sentinel::config::flags::SourceSettings::AirflowApi {
            url: url::Url::parse(&format!("http://{fake_addr}")).unwrap(),
            credentials: airflow::rest_api::RestCredentials::Token("airflow-token".into()),
            ca: None,
        },
        &metrics,
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    app::start_with(config, kubernetes, source, metrics, listener).await
}

pub async fn fake_airflow() -> (Arc<FakeAirflow>, TestServer) {
    let fake = Arc::new(FakeAirflow::default());
    *fake.token.lock().unwrap() = "airflow-token".into();
    let server = fake.start().await;
    (fake, server)
}
