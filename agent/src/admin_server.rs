//! The agent's own HTTP endpoints, apart from the data path: `/metrics`, `/healthz`, `/readyz`.

use crate::metrics::Metrics;
use bytes::Bytes;
use http_body_util::Full;
use http_server::Readiness;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Prometheus and the kubelet's probes need a few connections; the cap keeps the agent's file
/// descriptors for its tasks, whatever connects to this port.
const MAX_CONNECTIONS: usize = 32;

/// Serves until `stop` is cancelled. The listener is bound by the caller so that a bad address
/// fails at start-up rather than in the background.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    stop: CancellationToken,
) {
    let limits = http_server::Limits {
        max_connections: MAX_CONNECTIONS,
        ..http_server::Limits::default()
    };
    let handler = move |req: Request<Incoming>| {
        let response = respond(&req, &metrics, &readiness);
        async move { response }
    };
    http_server::serve(listener, limits, handler, stop.cancelled_owned()).await;
}

fn respond(
    req: &Request<Incoming>,
    metrics: &Metrics,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let mut response = text(StatusCode::OK, metrics.render());
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if readiness.get() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: not registered with Airflow yet, or draining\n",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}
