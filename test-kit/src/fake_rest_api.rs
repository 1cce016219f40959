//! A fake Airflow REST API v2, as the Sentinel's `airflow-api` source reads it.

use crate::server::{json_response, serve, TestServer};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn query_params(req: &Request<Incoming>) -> HashMap<String, String> {
    url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// A fake Airflow REST API v2: lists the task instances of one queue in some states,
/// `GET /api/v2/dags/~/dagRuns/~/taskInstances?queue=Q&state=S&order_by=id&limit=N&offset=M`,
/// at most [`FAKE_PAGE_LIMIT`] a page as Airflow's default `maximum_page_limit` does; and,
/// once given some, the edge3 provider's job list `GET /edge_worker/ui/jobs` (404 before).
#[derive(Default)]
pub struct FakeAirflow {
    instances: Mutex<HashMap<String, Vec<FakeInstance>>>,
    failing: Mutex<HashSet<String>>,
    hanging: Mutex<HashSet<String>>,
    slow: Mutex<HashMap<String, Duration>>,
    /// Queues whose pages come back empty while `total_entries` still counts them.
    unlisted: Mutex<HashSet<String>>,
    /// The Edge jobs `GET /edge_worker/ui/jobs` lists (whatever its filters); `None`: a
    /// provider without that list (404).
    edge_jobs: Mutex<Option<Vec<serde_json::Value>>>,
    /// A status the job list answers with instead (403, 500...).
    edge_jobs_status: Mutex<Option<u16>>,
    /// Task-instance requests answered (not the job list's).
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

    /// Serves the job list with these rows (the provider's `Job` fields).
    pub fn set_edge_jobs(&self, jobs: Vec<serde_json::Value>) {
        *self.edge_jobs.lock().unwrap() = Some(jobs);
    }

    /// Makes the job list answer `status` (`None`: normally again).
    pub fn edge_jobs_answer(&self, status: Option<u16>) {
        *self.edge_jobs_status.lock().unwrap() = status;
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

    fn edge_jobs_answer_to(&self) -> Response<Full<Bytes>> {
        if let Some(status) = *self.edge_jobs_status.lock().unwrap() {
            return json_response(status, serde_json::json!({"detail": "as the test asked"}));
        }
        match self.edge_jobs.lock().unwrap().clone() {
            Some(jobs) => json_response(
                200,
                serde_json::json!({"total_entries": jobs.len(), "jobs": jobs}),
            ),
            None => json_response(404, serde_json::json!({"detail": "Not Found"})),
        }
    }

    fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.uri().path() == "/edge_worker/ui/jobs" {
            return self.edge_jobs_answer_to();
        }
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

/// A fake Airflow that accepts the token `airflow-token`, and its server.
pub async fn fake_airflow() -> (Arc<FakeAirflow>, TestServer) {
    let fake = Arc::new(FakeAirflow::default());
    *fake.token.lock().unwrap() = "airflow-token".into();
    let server = fake.start().await;
    (fake, server)
}
