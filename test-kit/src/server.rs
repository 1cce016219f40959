//! Serving a handler over HTTP/1.1 on a free loopback port: the plumbing of every fake server.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

/// A server answering with a handler; it and its connections stop when this is dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: DropGuard,
}

impl TestServer {
    /// Keeps serving until the test's runtime ends, for a fake that its clones share and no
    /// one owns; its address.
    pub fn detach(self) -> SocketAddr {
        self.stop.disarm();
        self.addr
    }
}

/// Serves `handler` on 127.0.0.1 at a port the kernel picks.
pub async fn serve<F, Fut>(handler: F) -> TestServer
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stopped = CancellationToken::new();
    let stop = stopped.clone().drop_guard();
    let handler = Arc::new(handler);
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                s = listener.accept() => match s { Ok((s, _)) => s, Err(_) => continue },
                _ = stopped.cancelled() => return,
            };
            let handler = handler.clone();
            let conn_stopped = stopped.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(req).await) }
                });
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = conn_stopped.cancelled() => {}
                }
            });
        }
    });
    TestServer { addr, stop }
}

/// An answer with a JSON body.
pub fn json_response(status: u16, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}
