//! What each request gets: auth for `/v1/*`, JSON answers and errors.
//!
//! Which path goes where is in [`routes`](super::routes).
//!
//! Other methods get 405, requests with a body 413; every error body is JSON `{"error": …}`.
//! KEDA's `metrics-api` scaler sends a bare GET (no `Accept`), so content negotiation is
//! deliberately absent.

use crate::backlog::cache::BacklogCache;
use crate::backlog::worker_view::{worker_answer, Unavailable, WorkerAnswer, WorkerBacklog};
use crate::config::file::{ScaledBy, WorkerConfig};
use crate::history::range::HistoryRange;
use crate::history::store::History;
use crate::metrics::Metrics;
use crate::serve::auth::{Authenticator, Decision, Readable, Scope};
use crate::serve::queue_events::QueueEvents;
use crate::serve::response::{error, json, respond, text, Body};
use crate::serve::routes::{Route, V1Route};
use crate::serve::ui;
use http_server::Readiness;
use hyper::header::{
    HeaderValue, ALLOW, AUTHORIZATION, IF_NONE_MATCH, RETRY_AFTER, WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything a request handler reads.
pub struct AppState {
    workers: Vec<WorkerConfig>,
    index: HashMap<String, usize>,
    pub cache: Arc<BacklogCache>,
    pub staleness_limit: Duration,
    pub auth: Authenticator,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    pub history: Arc<History>,
    /// The agents' wake-up stream; without it `/v1/queues/events` is a 404.
    pub queue_events: Option<QueueEvents>,
    /// The workers an HPA scales (their history says so).
    hpa_scaled: BTreeSet<String>,
}

impl AppState {
    pub fn new(
        workers: Vec<WorkerConfig>,
        cache: Arc<BacklogCache>,
        staleness_limit: Duration,
        auth: Authenticator,
        metrics: Arc<Metrics>,
        readiness: Readiness,
        history: Arc<History>,
    ) -> Self {
        let index = workers
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.clone(), i))
            .collect();
        AppState {
            workers,
            index,
            cache,
            staleness_limit,
            auth,
            metrics,
            readiness,
            history,
            queue_events: None,
            hpa_scaled: BTreeSet::new(),
        }
    }

    /// Says which workers an HPA scales.
    pub fn with_hpa_scaled(mut self, hpa_scaled: BTreeSet<String>) -> Self {
        self.hpa_scaled = hpa_scaled;
        self
    }

    /// Serves the agents' wake-up stream as well.
    pub fn with_queue_events(mut self, queue_events: QueueEvents) -> Self {
        self.queue_events = Some(queue_events);
        self
    }

    pub fn workers(&self) -> &[WorkerConfig] {
        &self.workers
    }
}

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Answers one request and counts it in `astro_sentinel_http_requests_total`.
pub async fn handle<B: hyper::body::Body>(state: &AppState, req: Request<B>) -> Response<Body> {
    let (handler, response) = route(state, &req).await;
    state
        .metrics
        .http_requests
        .with_label_values(&[handler, response.status().as_str()])
        .inc();
    response
}

async fn route<B: hyper::body::Body>(
    state: &AppState,
    req: &Request<B>,
) -> (&'static str, Response<Body>) {
    let path = req.uri().path();
    let route = Route::parse(path);
    let handler = route.handler();
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("method {} not allowed; use GET", req.method()),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return (handler, r);
    }
    // Every endpoint is a GET: a request that carries a body is refused unread.
    if req.body().size_hint().upper() != Some(0) {
        return (
            handler,
            error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request bodies are not accepted".into(),
            ),
        );
    }
    let response = match route {
        Route::Healthz => text(StatusCode::OK, "ok\n"),
        Route::Readyz => {
            if state.readiness.get() {
                text(StatusCode::OK, "ready\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: no successful refresh yet\n",
                )
            }
        }
        Route::Metrics => {
            let body = state.metrics.render(
                &state.cache.snapshot(),
                &state.workers,
                Instant::now(),
                state.staleness_limit,
            );
            respond(StatusCode::OK, PROMETHEUS_TEXT, body.into())
        }
        Route::Ui => {
            let if_none_match = req.headers().get(IF_NONE_MATCH).map(|v| v.as_bytes());
            ui::answer(path, if_none_match)
                .unwrap_or_else(|| error(StatusCode::NOT_FOUND, format!("no such file: {path}")))
        }
        Route::V1(v1) => {
            let authorization = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
            match v1 {
                V1Route::QueueEvents => {
                    match state.auth.check(authorization, Scope::Subscribe).await {
                        Decision::Allow => match &state.queue_events {
                            Some(events) => events.subscribe(req.uri().query()),
                            None => {
                                error(StatusCode::NOT_FOUND, format!("no such endpoint: {path}"))
                            }
                        },
                        refusal => refused(refusal),
                    }
                }
                V1Route::Workers => {
                    let names: Vec<&str> = state.workers.iter().map(|w| w.name.as_str()).collect();
                    match state.auth.readable(authorization, &names).await {
                        Ok(readable) => list(state, &readable),
                        Err(refusal) => refused(refusal),
                    }
                }
                V1Route::Worker(name) | V1Route::History(name) => {
                    // An unknown name is asked about as no worker: authenticated, then a 404.
                    let asked: &[&str] = if state.index.contains_key(name) {
                        &[name]
                    } else {
                        &[]
                    };
                    match state.auth.readable(authorization, asked).await {
                        Ok(_) if matches!(v1, V1Route::History(_)) => {
                            history(state, name, req.uri().query())
                        }
                        Ok(_) => one(state, name),
                        Err(refusal) => refused(refusal),
                    }
                }
            }
        }
        Route::Other => error(StatusCode::NOT_FOUND, format!("no such endpoint: {path}")),
    };
    (handler, response)
}

/// The answer to a caller `auth` did not let in.
fn refused(decision: Decision) -> Response<Body> {
    match decision {
        Decision::Unauthorized(message) => unauthorized(message),
        Decision::Forbidden(message) => error(StatusCode::FORBIDDEN, message),
        Decision::Unavailable {
            message,
            retry_after,
        } => auth_unavailable(message, retry_after),
        Decision::Allow => unreachable!("an allowed caller is served, not refused"),
    }
}

fn unauthorized(message: String) -> Response<Body> {
    let mut r = error(StatusCode::UNAUTHORIZED, message);
    r.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"astro-sentinel\""),
    );
    r
}

/// The token could not be checked right now.
fn auth_unavailable(message: String, retry_after: Option<Duration>) -> Response<Body> {
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, message);
    if let Some(wait) = retry_after {
        // Whole seconds, at least one: a zero would invite an immediate retry.
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    r
}

fn one(state: &AppState, name: &str) -> Response<Body> {
    let Some(&i) = state.index.get(name) else {
        return error(StatusCode::NOT_FOUND, format!("unknown worker {name:?}"));
    };
    let snapshot = state.cache.snapshot();
    match worker_answer(
        &state.workers[i],
        &snapshot,
        Instant::now(),
        state.staleness_limit,
    ) {
        WorkerAnswer::Ready(b) => json(StatusCode::OK, &b),
        WorkerAnswer::Unavailable(u) => json(StatusCode::SERVICE_UNAVAILABLE, &u),
    }
}

/// `GET /v1/workers/{name}/history?range=15m|1h|6h|1d|7d|14d` (default `1d`).
fn history(state: &AppState, name: &str, query: Option<&str>) -> Response<Body> {
    let mut range = HistoryRange::default();
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if key == "range" {
            match HistoryRange::parse(&value) {
                Some(r) => range = r,
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("range: must be one of 15m, 1h, 6h, 1d, 7d, 14d, got {value:?}"),
                    )
                }
            }
        }
    }
    let Some(&i) = state.index.get(name) else {
        return error(StatusCode::NOT_FOUND, format!("unknown worker {name:?}"));
    };
    let mut answer = state.history.answer(&state.workers[i], range);
    if state.hpa_scaled.contains(name) {
        answer.scaled_by = ScaledBy::Hpa;
    }
    json(StatusCode::OK, &answer)
}

/// One entry of `GET /v1/workers`: the worker's own answer plus `available`.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Listed {
    Ready(Flagged<WorkerBacklog>),
    Unavailable(Flagged<Unavailable>),
}

#[derive(serde::Serialize)]
struct Flagged<T> {
    #[serde(flatten)]
    answer: T,
    available: bool,
}

/// Every worker `readable` includes (a person sees only the Deployments they may get).
fn list(state: &AppState, readable: &Readable) -> Response<Body> {
    let snapshot = state.cache.snapshot();
    let now = Instant::now();
    let workers: Vec<Listed> = state
        .workers
        .iter()
        .filter(|w| readable.includes(&w.name))
        .map(
            |w| match worker_answer(w, &snapshot, now, state.staleness_limit) {
                WorkerAnswer::Ready(answer) => Listed::Ready(Flagged {
                    answer,
                    available: true,
                }),
                WorkerAnswer::Unavailable(answer) => Listed::Unavailable(Flagged {
                    answer,
                    available: false,
                }),
            },
        )
        .collect();
    json(StatusCode::OK, &serde_json::json!({ "workers": workers }))
}
