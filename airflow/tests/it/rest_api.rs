//! The REST v2 counts client against an in-test server that answers like Airflow's api-server.

use airflow::rest_api::{QueueCounts, RestApiClient, RestCredentials};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Server {
    logins: u32,
    /// The token the server accepts now; a login issues a new one.
    valid_token: String,
    queries: Vec<String>,
    malformed: bool,
}

async fn start(server: Arc<Mutex<Server>>) -> url::Url {
    let running = test_kit::serve(move |req: Request<Incoming>| {
        let server = server.clone();
        async move { answer(&server, req) }
    })
    .await;
    // Each test's runtime ends with the test, and the server with it.
    let addr = running.detach();
    format!("http://{addr}/").parse().unwrap()
}

fn answer(server: &Mutex<Server>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let mut s = server.lock().unwrap();
    let reply = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() == "/auth/token" {
        s.logins += 1;
        s.valid_token = format!("token-{}", s.logins);
        return reply(
            StatusCode::CREATED,
            format!("{{\"access_token\": \"{}\"}}", s.valid_token),
        );
    }
    assert_eq!(req.uri().path(), "/api/v2/dags/~/dagRuns/~/taskInstances");
    let auth = req
        .headers()
        .get("authorization")
        .unwrap()
        .to_str()
        .unwrap();
    if auth != format!("Bearer {}", s.valid_token) {
        return reply(StatusCode::UNAUTHORIZED, "{\"detail\": \"expired\"}".into());
    }
    let query = req.uri().query().unwrap().to_string();
    s.queries.push(query.clone());
    if s.malformed {
        return reply(StatusCode::OK, "{\"total\": 3}".into());
    }
    // 7 queued and 2 running; a query naming several states counts them all.
    let n: u64 = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| match (k.as_ref(), v.as_ref()) {
            ("state", "queued") => 7,
            ("state", "running") => 2,
            _ => 0,
        })
        .sum();
    reply(
        StatusCode::OK,
        format!("{{\"task_instances\": [], \"total_entries\": {n}}}"),
    )
}

#[tokio::test]
async fn counts_queued_and_running_with_limit_zero() {
    let server = Arc::new(Mutex::new(Server::default()));
    let url = start(server.clone()).await;
    let creds = RestCredentials::Password {
        username: "u".into(),
        password: "p".into(),
    };
    let client = RestApiClient::new(&url, creds, "rest-api-test", None).unwrap();
    let counts = client.queue_counts("high prio").await.unwrap();
    assert_eq!(
        counts,
        QueueCounts {
            queued: 7,
            running: 2
        }
    );
    let s = server.lock().unwrap();
    assert_eq!(s.logins, 1, "one login serves both counts");
    assert_eq!(
        s.queries[0],
        "queue=high+prio&state=queued&state=running&limit=0"
    );
    assert_eq!(s.queries[1], "queue=high+prio&state=queued&limit=0");
}

#[tokio::test]
async fn a_401_logs_in_again_once() {
    let server = Arc::new(Mutex::new(Server::default()));
    let url = start(server.clone()).await;
    let creds = RestCredentials::Password {
        username: "u".into(),
        password: "p".into(),
    };
    let client = RestApiClient::new(&url, creds, "rest-api-test", None).unwrap();
    client.count("default", &["queued"]).await.unwrap();
    // The server rotates its secret: the old token is refused.
    server.lock().unwrap().valid_token = "rotated".into();
    assert_eq!(client.count("default", &["queued"]).await.unwrap(), 7);
    assert_eq!(server.lock().unwrap().logins, 2);
}

#[tokio::test]
async fn a_fixed_token_is_not_renewed_and_errors_are_typed() {
    let server = Arc::new(Mutex::new(Server {
        valid_token: "fixed".into(),
        ..Default::default()
    }));
    let url = start(server.clone()).await;
    let client = RestApiClient::new(
        &url,
        RestCredentials::Token("fixed".into()),
        "rest-api-test",
        None,
    )
    .unwrap();
    assert_eq!(client.count("default", &["running"]).await.unwrap(), 2);
    server.lock().unwrap().malformed = true;
    let e = client.count("default", &["running"]).await.unwrap_err();
    assert!(
        e.is_retryable() && e.to_string().contains("malformed"),
        "{e}"
    );
    server.lock().unwrap().valid_token = "other".into();
    let e = client.count("default", &["running"]).await.unwrap_err();
    assert_eq!(e.status(), Some(401));
    assert!(!e.is_retryable());
    assert_eq!(server.lock().unwrap().logins, 0);
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_transport_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url: url::Url = format!("http://127.0.0.1:{port}").parse().unwrap();
    let client = RestApiClient::new(
        &url,
        RestCredentials::Token("t".into()),
        "rest-api-test",
        None,
    )
    .unwrap();
    let e = client.count("default", &["queued"]).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(
        e.to_string().starts_with("rest_count: transport error"),
        "{e}"
    );
}
