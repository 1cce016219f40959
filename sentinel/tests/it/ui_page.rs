//! The page's routes through the real server: `/ui/` and its files need no token, while the
//! API the page reads still does; unknown files are 404; the headers a browser obeys are set.

use crate::common::*;
use std::time::Duration;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::{eventually, raw_request, TempDir, TestServer};

const TOKEN: &str = "ui-static-token-0123456789";

async fn sentinel() -> (astro_sentinel::app::Running, TempDir, TestServer) {
    let (fake, upstream) = fake_airflow().await;
    fake.set("default", 3, 1);
    let dir = TempDir::new("ui");
    let tokens = dir.file("tokens", &format!("{TOKEN}\n"));
    let yaml = format!(
        "refreshInterval: 100ms
stalenessLimit: 30s
auth:
  staticTokensFile: {}
workers:
  - name: astro-worker-default
    queues: [default]
    syncSlots: 4
    minReplicas: 1
    maxReplicas: 5
",
        tokens.display()
    );
    let running = start_against(upstream.addr, &yaml, None).await;
    (running, dir, upstream)
}

fn get(path: &str, extra_headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra_headers}Connection: close\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_needs_no_token_but_its_api_does() {
    let (sentinel, _dir, _upstream) = sentinel().await;
    let addr = sentinel.addr();

    for (path, content_type, marker) in [
        ("/ui/", "text/html; charset=utf-8", "<script src=\"app.js\""),
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "../v1/workers",
        ),
        ("/ui/app.css", "text/css; charset=utf-8", ".bar"),
    ] {
        let a = raw_request(addr, &get(path, "")).await;
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        assert_eq!(a.header("content-type"), Some(content_type), "{path}");
        assert_eq!(a.header("cache-control"), Some("no-cache"), "{path}");
        let csp = a.header("content-security-policy").unwrap_or_default();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(
                csp.contains(directive),
                "{path}: {directive} not in {csp:?}"
            );
        }
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
        assert!(a.body.contains(marker), "{path} lacks {marker}");
        assert!(a.header("www-authenticate").is_none());

        // Revalidation: the same tag gets a 304 with no body.
        let etag = a.header("etag").expect("an ETag").to_string();
        let again = raw_request(addr, &get(path, &format!("If-None-Match: {etag}\r\n"))).await;
        assert_eq!(again.status, 304, "{path}");
        assert!(again.body.is_empty());
    }

    // The bare path redirects so that the page's relative URLs resolve under /ui/.
    let bare = raw_request(addr, &get("/ui", "")).await;
    assert_eq!(bare.status, 308);
    assert_eq!(bare.header("location"), Some("/ui/"));

    // HEAD: the headers without the body.
    let head = raw_request(
        addr,
        "HEAD /ui/app.js HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());

    // Unknown files under /ui/ are 404, whatever their shape.
    for path in [
        "/ui/index.htm",
        "/ui/app.js/x",
        "/ui/../v1/workers",
        "/ui/%2e%2e/v1/workers",
        "/uix",
    ] {
        let a = raw_request(addr, &get(path, "")).await;
        assert_eq!(a.status, 404, "{path}: {}", a.body);
        assert!(a.json()["error"].is_string(), "{path}");
    }

    // The page's data calls still need the token.
    assert_eq!(keda_get(addr, "/v1/workers", None).await.status, 401);
    assert_eq!(
        keda_get(addr, "/v1/workers", Some("not-the-token"))
            .await
            .status,
        401
    );
    let list = eventually(Duration::from_secs(5), "the worker list", || async {
        let a = keda_get(addr, "/v1/workers", Some(TOKEN)).await;
        (a.status == 200 && a.json()["workers"][0]["available"] == true).then_some(a)
    })
    .await;
    let worker = &list.json()["workers"][0];
    assert_eq!(
        (&worker["minReplicas"], &worker["maxReplicas"]),
        (&1.into(), &5.into())
    );

    // Counted under their own handler.
    let metrics = keda_get(addr, "/metrics", None).await.body;
    assert!(
        metrics.contains(r#"astro_sentinel_http_requests_total{code="200",handler="ui"}"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"astro_sentinel_http_requests_total{code="404",handler="ui"}"#),
        "{metrics}"
    );

    sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_worker_still_tells_its_range() {
    let (fake, upstream) = fake_airflow().await;
    fake.fail("etl", true);
    let dir = TempDir::new("ui-unavailable");
    let tokens = dir.file("tokens", &format!("{TOKEN}\n"));
    let yaml = format!(
        "refreshInterval: 100ms
stalenessLimit: 30s
auth:
  staticTokensFile: {}
workers:
  - name: astro-worker-etl
    queues: [etl]
    syncSlots: 8
    minReplicas: 2
    maxReplicas: 7
",
        tokens.display()
    );
    let sentinel = start_against(upstream.addr, &yaml, None).await;
    let addr = sentinel.addr();
    // The failing queue is never loaded: the worker is 503 in the list, with its range.
    eventually(Duration::from_secs(5), "a failed refresh", || async {
        let m = keda_get(addr, "/metrics", None).await.body;
        m.contains(r#"astro_sentinel_queue_refresh_failures_total{queue="etl"} "#)
            .then_some(())
    })
    .await;
    let list = keda_get(addr, "/v1/workers", Some(TOKEN)).await;
    assert_eq!(list.status, 200);
    let worker = &list.json()["workers"][0];
    assert_eq!(worker["available"], false, "{worker}");
    assert_eq!(worker["syncSlots"], 8);
    assert_eq!(worker["minReplicas"], 2);
    assert_eq!(worker["maxReplicas"], 7);
    assert!(worker.get("backlog").is_none(), "never a made-up backlog");
    drop(upstream);
    sentinel.stop().await;
}
