//! Never a made-up 0: failed refreshes keep the last value until the staleness limit, then the
//! worker answers 503; a queue never read answers 503; one failing queue does not take the
//! others down; and the upstream is read once per queue per interval however often KEDA asks.

use crate::common::*;
use std::time::{Duration, Instant};
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::{keda_get, value_at};
use test_kit::{eventually, TempDir};

const TOKEN: &str = "t0ken";

fn yaml(tokens: &std::path::Path, refresh: &str, staleness: &str) -> String {
    format!(
        "refreshInterval: {refresh}
stalenessLimit: {staleness}
auth:
  staticTokensFile: {}
workers:
  - {{name: worker-a, queues: [a], syncSlots: 4}}
  - {{name: worker-b, queues: [b], syncSlots: 4}}
  - {{name: worker-ab, queues: [a, b], syncSlots: 4}}
  - {{name: worker-b2, queues: [b], syncSlots: 1, maxReplicas: 100}}
",
        tokens.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_upstream_turns_into_503_after_the_limit_never_into_0() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("a", 10, 2);
    fake.set("b", 1, 0);
    let dir = TempDir::new("stale");
    let tokens = dir.file("tokens", TOKEN);
    let staleness = Duration::from_millis(800);
    let sentinel = start_against(upstream.addr, &yaml(&tokens, "100ms", "800ms"), None).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "first value", || async {
        let a = keda_get(addr, "/v1/workers/worker-a", Some(TOKEN)).await;
        (a.status == 200).then_some(())
    })
    .await;

    // Queue a breaks. Until the limit: the last value (12), with a growing age; then 503.
    fake.fail("a", true);
    let broke = Instant::now();
    let stale = loop {
        let a = keda_get(addr, "/v1/workers/worker-a", Some(TOKEN)).await;
        match a.status {
            200 => assert_eq!(value_at(&a, "backlog"), 12.0, "the last value, never 0"),
            503 => break a,
            other => panic!("unexpected {other}: {}", a.body),
        }
        assert!(broke.elapsed() < Duration::from_secs(5), "never went stale");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        broke.elapsed() >= staleness - Duration::from_millis(150),
        "stale too early"
    );
    let body = stale.json();
    assert_eq!(body["reason"], "stale");
    assert!(body["error"].as_str().unwrap().contains("stale"));
    assert!(body.get("backlog").is_none(), "no number in a 503: {body}");
    assert_eq!(body["queues"], serde_json::json!(["a"]));
    assert_eq!(body["queueStatus"][0]["queue"], "a");
    assert_eq!(body["queueStatus"][0]["state"], "stale");
    assert!(body["queueStatus"][0]["lastError"]
        .as_str()
        .unwrap()
        .contains("500"));

    // Partial failure: b's workers are fine, the worker that also needs a is not.
    let b = keda_get(addr, "/v1/workers/worker-b", Some(TOKEN)).await;
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(value_at(&b, "backlog"), 1.0);
    let ab = keda_get(addr, "/v1/workers/worker-ab", Some(TOKEN)).await;
    assert_eq!(ab.status, 503, "{}", ab.body);
    let states: Vec<_> = ab.json()["queueStatus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["state"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(states, ["stale", "fresh"]);
    let list = keda_get(addr, "/v1/workers", Some(TOKEN)).await.json();
    let available: Vec<_> = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["worker"].as_str().unwrap().to_string(),
                w["available"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        available,
        [
            ("worker-a".to_string(), false),
            ("worker-b".to_string(), true),
            ("worker-ab".to_string(), false),
            ("worker-b2".to_string(), true)
        ]
    );
    // Metrics: no backlog series for a stale worker (absent, not 0), failures counted.
    let metrics = keda_get(addr, "/metrics", None).await.body;
    assert!(
        metrics.contains("astro_sentinel_worker_available{worker=\"worker-a\"} 0"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("astro_sentinel_worker_backlog{worker=\"worker-a\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("astro_sentinel_worker_backlog{worker=\"worker-b\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("astro_sentinel_queue_refresh_failures_total{queue=\"a\"}"),
        "{metrics}"
    );

    // Recovery: 200 again with the new value.
    fake.set("a", 0, 0);
    fake.fail("a", false);
    eventually(Duration::from_secs(5), "200 after recovery", || async {
        let a = keda_get(addr, "/v1/workers/worker-a", Some(TOKEN)).await;
        (a.status == 200 && value_at(&a, "backlog") == 0.0).then_some(())
    })
    .await;
    sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_gone_goes_stale_too() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("a", 3, 0);
    let dir = TempDir::new("gone");
    let tokens = dir.file("tokens", TOKEN);
    let sentinel = start_against(upstream.addr, &yaml(&tokens, "100ms", "500ms"), None).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "first value", || async {
        let a = keda_get(addr, "/v1/workers/worker-a", Some(TOKEN)).await;
        (a.status == 200).then_some(())
    })
    .await;
    drop(upstream); // connection refused from now on
    let a = eventually(Duration::from_secs(5), "503", || async {
        let a = keda_get(addr, "/v1/workers/worker-a", Some(TOKEN)).await;
        if a.status == 200 {
            assert_eq!(value_at(&a, "backlog"), 3.0);
        }
        (a.status == 503).then_some(a)
    })
    .await;
    assert_eq!(a.json()["reason"], "stale");
    // Still ready: KEDA must keep hearing explicit 503s from us.
    assert_eq!(keda_get(addr, "/readyz", None).await.status, 200);
    sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_read_yet_is_503_and_not_ready() {
    let (fake, upstream) = fake_airflow().await;
    fake.fail("a", true);
    fake.fail("b", true);
    let dir = TempDir::new("notloaded");
    let tokens = dir.file("tokens", TOKEN);
    let sentinel = start_against(upstream.addr, &yaml(&tokens, "100ms", "30s"), None).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "a failed refresh", || async {
        (fake.requests() >= 4).then_some(())
    })
    .await;
    let a = keda_get(addr, "/v1/workers/worker-a", Some(TOKEN)).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.json()["reason"], "notLoaded");
    let ready = keda_get(addr, "/readyz", None).await;
    assert_eq!(ready.status, 503);
    fake.fail("b", false);
    eventually(
        Duration::from_secs(5),
        "ready after the first good read",
        || async { (keda_get(addr, "/readyz", None).await.status == 200).then_some(()) },
    )
    .await;
    assert_eq!(
        keda_get(addr, "/v1/workers/worker-b", Some(TOKEN))
            .await
            .status,
        200
    );
    assert_eq!(
        keda_get(addr, "/v1/workers/worker-a", Some(TOKEN))
            .await
            .status,
        503
    );
    sentinel.stop().await;
}

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_cost_does_not_depend_on_how_often_keda_asks() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("a", 1, 1);
    fake.set("b", 2, 2);
    let dir = TempDir::new("cost");
    let tokens = dir.file("tokens", TOKEN);
    let sentinel = start_against(upstream.addr, &yaml(&tokens, "200ms", "30s"), None).await;
    let addr = sentinel.addr();
    eventually(Duration::from_secs(5), "ready", || async {
        (keda_get(addr, "/readyz", None).await.status == 200).then_some(())
    })
    .await;

    // Hammer the API for a while; four workers share two queues.
    let started = Instant::now();
    let mut asked = 0;
    while started.elapsed() < Duration::from_secs(1) {
        for w in ["worker-a", "worker-b", "worker-ab", "worker-b2"] {
            assert_eq!(
                keda_get(addr, &format!("/v1/workers/{w}"), Some(TOKEN))
                    .await
                    .status,
                200
            );
            asked += 1;
        }
    }
    let m = keda_get(addr, "/metrics", None).await.body;
    let refreshes = metric(&m, "astro_sentinel_refreshes_total");
    let upstream_requests = metric(&m, "astro_sentinel_upstream_requests_total");
    let held_reads = metric(&m, "astro_sentinel_held_task_reads_total");
    assert!(asked > 100, "only {asked} requests");
    assert!(held_reads >= 1.0, "the held-back tasks were never counted");
    // Two distinct queues with under a page of task instances each: one request each per
    // refresh, the list of Edge workers once per refresh interval on its own cadence (a refresh
    // may be in flight while the metrics are read: its requests are counted, the refresh not
    // yet), and one count of each queue's scheduled task instances per held-back read.
    let expected = |refreshes: f64| refreshes * 3.0 + held_reads * 2.0;
    assert!(
        upstream_requests >= expected(refreshes) - 1.0
            && upstream_requests <= expected(refreshes + 1.0) + 2.0 + 1.0,
        "{upstream_requests} upstream requests for {refreshes} refreshes and {held_reads} held-back reads"
    );
    assert!(fake.requests() as f64 <= expected(refreshes + 1.0) + 2.0 + 1.0);
    assert!(refreshes <= 1.0 + (started.elapsed().as_secs_f64() + 1.0) / 0.2 + 1.0);
    let served = metric(
        &m,
        "astro_sentinel_http_requests_total{code=\"200\",handler=\"worker\"}",
    );
    assert!(served >= asked as f64);
    sentinel.stop().await;
}
