//! The KEDA-facing API end to end in-process: a fake Airflow REST API upstream, the real
//! airflow-api source, refresh loop, cache, static-token auth and HTTP server, and a client
//! that calls exactly as KEDA's metrics-api scaler does.

use crate::common::*;
use std::time::Duration;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::{keda_get, value_at};
use test_kit::{eventually, raw_request, TempDir};

const TOKEN: &str = "keda-static-token-0123456789";

fn yaml(tokens_file: &std::path::Path, refresh: &str, staleness: &str) -> String {
    format!(
        "refreshInterval: {refresh}
stalenessLimit: {staleness}
auth:
  staticTokensFile: {}
workers:
  - name: astro-worker-default
    queues: [default]
    syncSlots: 4
    minReplicas: 0
    maxReplicas: 10
  - name: astro-worker-etl
    queues: [etl, heavy]
    syncSlots: 16
    minReplicas: 1
    maxReplicas: 3
  - name: astro-worker-shared
    queues: [default]
    syncSlots: 16
",
        tokens_file.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keda_reads_backlog_by_its_json_path() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("default", 25, 5);
    fake.set("etl", 40, 10);
    fake.set("heavy", 3, 0);
    let dir = TempDir::new("keda");
    let tokens = dir.file("tokens", &format!("# KEDA's token\n{TOKEN}\n"));
    let sentinel = start_against(upstream.addr, &yaml(&tokens, "100ms", "30s"), None).await;
    let addr = sentinel.addr();

    let answer = eventually(
        Duration::from_secs(5),
        "a 200 from the sentinel",
        || async {
            let a = keda_get(addr, "/v1/workers/astro-worker-default", Some(TOKEN)).await;
            (a.status == 200).then_some(a)
        },
    )
    .await;
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(value_at(&answer, "backlog"), 30.0);
    let body = answer.json();
    assert_eq!(body["worker"], "astro-worker-default");
    assert_eq!(body["queues"], serde_json::json!(["default"]));
    assert_eq!(body["queued"], 25);
    assert_eq!(body["running"], 5);
    assert_eq!(body["syncSlots"], 4);
    assert_eq!(body["desiredReplicas"], 8, "ceil(30 / 4)");
    assert_eq!(body["minReplicas"], 0);
    assert_eq!(body["maxReplicas"], 10);
    assert!(body["updatedAt"].as_str().unwrap().ends_with('Z'));
    assert!(body["ageSeconds"].as_f64().unwrap() < 5.0);

    // Two queues summed; desired held at max.
    let etl = keda_get(addr, "/v1/workers/astro-worker-etl", Some(TOKEN)).await;
    assert_eq!(etl.status, 200, "{}", etl.body);
    assert_eq!(value_at(&etl, "backlog"), 53.0);
    assert_eq!(
        etl.json()["desiredReplicas"],
        3,
        "ceil(53/16)=4 held at max 3"
    );

    // A queue change shows within a couple of refreshes.
    fake.set("default", 0, 0);
    eventually(
        Duration::from_secs(5),
        "backlog 0 after the queue drained",
        || async {
            let a = keda_get(addr, "/v1/workers/astro-worker-default", Some(TOKEN)).await;
            (a.status == 200 && value_at(&a, "backlog") == 0.0).then_some(())
        },
    )
    .await;
    let a = keda_get(addr, "/v1/workers/astro-worker-etl", Some(TOKEN)).await;
    assert_eq!(a.status, 200);

    // The list.
    let all = keda_get(addr, "/v1/workers", Some(TOKEN)).await;
    assert_eq!(all.status, 200);
    let workers = all.json()["workers"].as_array().unwrap().clone();
    assert_eq!(workers.len(), 3);
    assert!(workers.iter().all(|w| w["available"] == true));

    sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_json_and_precise() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("default", 1, 0);
    let dir = TempDir::new("errors");
    let tokens = dir.file("tokens", &format!("{TOKEN}\n"));
    let sentinel = start_against(upstream.addr, &yaml(&tokens, "100ms", "30s"), None).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "ready", || async {
        let a = keda_get(addr, "/readyz", None).await;
        (a.status == 200).then_some(())
    })
    .await;

    // 401: no token, wrong token, wrong scheme. No worker data leaks.
    for auth in [None, Some("wrong-token"), Some("")] {
        let a = keda_get(addr, "/v1/workers/astro-worker-default", auth).await;
        assert_eq!(a.status, 401, "{auth:?}: {}", a.body);
        assert!(a.json()["error"].as_str().unwrap().contains("token"));
        assert!(a.header("www-authenticate").unwrap().starts_with("Bearer"));
        assert!(a.json().get("backlog").is_none());
    }
    let basic = raw_request(
        addr,
        &format!("GET /v1/workers HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {TOKEN}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert_eq!(basic.status, 401);
    // An unknown worker is 404 (after auth: names are not revealed to strangers).
    let a = keda_get(addr, "/v1/workers/nope", None).await;
    assert_eq!(a.status, 401);
    let a = keda_get(addr, "/v1/workers/nope", Some(TOKEN)).await;
    assert_eq!(a.status, 404);
    assert!(a.json()["error"].as_str().unwrap().contains("nope"));
    // Health and metrics are open.
    assert_eq!(keda_get(addr, "/healthz", None).await.status, 200);
    assert_eq!(keda_get(addr, "/metrics", None).await.status, 200);
    // Unknown path, other methods, bodies.
    assert_eq!(keda_get(addr, "/v2/nothing", Some(TOKEN)).await.status, 404);
    let post = raw_request(
        addr,
        "POST /v1/workers/astro-worker-default HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    assert!(post.json()["error"].is_string());
    let with_body = raw_request(
        addr,
        &format!("GET /v1/workers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"),
    )
    .await;
    assert_eq!(with_body.status, 413);
    // Oversized headers are refused by the server itself.
    let huge = raw_request(
        addr,
        &format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(64 * 1024)
        ),
    )
    .await;
    assert_eq!(huge.status, 431);

    sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_cut_off_by_the_header_read_timeout() {
    let (_fake, upstream) = fake_airflow().await;
    let dir = TempDir::new("slow");
    let tokens = dir.file("tokens", &format!("{TOKEN}\n"));
    let sentinel = start_against(upstream.addr, &yaml(&tokens, "1s", "30s"), None).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(sentinel.addr())
        .await
        .unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the server kept an incomplete request open");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "closed too early: {waited:?}"
    );
    sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_tokens_reload_when_the_file_changes() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("default", 2, 0);
    let dir = TempDir::new("reload");
    let tokens = dir.file("tokens", "old-token\n");
    let sentinel = start_against(upstream.addr, &yaml(&tokens, "100ms", "30s"), None).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "old token accepted", || async {
        let a = keda_get(addr, "/v1/workers/astro-worker-default", Some("old-token")).await;
        (a.status == 200).then_some(())
    })
    .await;
    assert_eq!(
        keda_get(addr, "/v1/workers/astro-worker-default", Some("new-token"))
            .await
            .status,
        401
    );
    // Kubernetes updates a mounted Secret by swapping a symlink; a rename does the same here.
    let next = dir.file("tokens.next", "new-token\n");
    std::fs::rename(&next, &tokens).unwrap();
    eventually(Duration::from_secs(5), "new token accepted", || async {
        let a = keda_get(addr, "/v1/workers/astro-worker-default", Some("new-token")).await;
        (a.status == 200).then_some(())
    })
    .await;
    assert_eq!(
        keda_get(addr, "/v1/workers/astro-worker-default", Some("old-token"))
            .await
            .status,
        401
    );
    sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_disabled_serves_without_a_token() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("q", 7, 0);
    let sentinel = start_against(
        upstream.addr,
        "refreshInterval: 100ms\nauth: {disabled: true}\nworkers:\n  - {name: w, queues: [q], syncSlots: 2}\n",
        None,
    )
    .await;
    let addr = sentinel.addr();
    let a = eventually(Duration::from_secs(5), "200 without token", || async {
        let a = keda_get(addr, "/v1/workers/w", None).await;
        (a.status == 200).then_some(a)
    })
    .await;
    assert_eq!(value_at(&a, "desiredReplicas"), 4.0);
    sentinel.stop().await;
}
