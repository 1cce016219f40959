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

/// How many connections the server holds (`--admin-*` flags). Prometheus and the kubelet's
/// probes need a few; the cap keeps the agent's file descriptors for its tasks, whatever
/// connects to this port. The per-peer share and the reserve keep a slot for the kubelet's
/// liveness probe however one client (or a few) floods the port: a probe that finds no slot
/// fails, and a few failures in a row restart the container with every task on it. The
/// probe's address cannot be named here: depending on the network plugin it is the node's
/// address or a bridge's, so it is protected as "a peer holding no connection".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminConnections {
    pub max: usize,
    pub per_peer: usize,
    pub reserved: usize,
}

/// Serves until `stop` is cancelled. The listener is bound by the caller so that a bad address
/// fails at start-up rather than in the background.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    connections: AdminConnections,
    stop: CancellationToken,
) {
    let limits = http_server::Limits {
        max_connections: connections.max,
        max_connections_per_peer: connections.per_peer,
        reserved_connections: connections.reserved,
        // The tasks share the Pod's network namespace: from however many loopback addresses
        // they connect, they are one peer, and the probe keeps its slot.
        one_peer_for_this_host: true,
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
