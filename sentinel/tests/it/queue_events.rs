//! `GET /v1/queues/events` over HTTP, against a fake Airflow and an in-test API server for
//! TokenReview: a worker's token opens the stream and nothing else, KEDA's token keeps every
//! endpoint, the stream tells the state then each rise, and the metrics count it.

use crate::common::*;
use astro_sentinel::config::kubernetes_access::KubernetesAccess;
use std::net::SocketAddr;
use std::time::Duration;
use test_kit::eventually;
use test_kit::fake_kubernetes::FakeKubernetes;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KEDA_SA: &str = "system:serviceaccount:keda:astro-agent-keda";
const WORKER_SA: &str = "system:serviceaccount:airflow:astro-agent-worker-default";
const KEDA_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrZWRhIn0.a2VkYS1ib3VuZA";
const WORKER_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ3b3JrZXIifQ.d29ya2Vy";
const T: Duration = Duration::from_secs(10);

/// An open event stream: what it has sent so far.
struct Stream {
    tcp: TcpStream,
    seen: String,
}

async fn open(addr: SocketAddr, query: &str, token: &str) -> Stream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET /v1/queues/events?{query} HTTP/1.1\r\nHost: sentinel\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    Stream {
        tcp,
        seen: String::new(),
    }
}

impl Stream {
    /// Reads until `text` has been sent, failing after [`T`].
    async fn until(&mut self, text: &str) {
        let deadline = tokio::time::Instant::now() + T;
        while !self.seen.contains(text) {
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, self.tcp.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no {text:?} within {T:?}; seen:\n{}", self.seen))
                .unwrap();
            assert!(n > 0, "closed before {text:?}; seen:\n{}", self.seen);
            self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_token_opens_the_stream_only_and_the_stream_tells_each_rise() {
    let (fake, airflow) = fake_airflow().await;
    fake.set("default", 0, 2);
    let fake_kube = FakeKubernetes::with_users(
        "sentinel-own-sa-token",
        &[(KEDA_TOKEN, KEDA_SA), (WORKER_TOKEN, WORKER_SA)],
    );
    let kube = fake_kube.start().await;
    let dir = TempDir::new("queue-events");
    let access = KubernetesAccess {
        api_url: url::Url::parse(&format!("http://{}", kube.addr)).unwrap(),
        token_file: dir.file("token", "sentinel-own-sa-token"),
        ca_file: dir.0.join("no-ca-needed-for-http"),
    };
    let yaml = format!(
        "refreshInterval: 100ms
auth:
  tokenReview:
    allowedUsernames: [\"{KEDA_SA}\"]
queueEvents:
  maxSubscribers: 2
  auth:
    tokenReview:
      allowedUsernames: [\"{WORKER_SA}\"]
workers:
  - {{name: astro-worker-default, queues: [default], syncSlots: 8}}
"
    );
    let sentinel = start_against(airflow.addr, &yaml, Some(access)).await;
    let addr = sentinel.addr();
    eventually(T, "ready", || async {
        (keda_get(addr, "/readyz", None).await.status == 200).then_some(())
    })
    .await;

    // The worker's token: the stream yes, the backlogs and the history no.
    for path in [
        "/v1/workers/astro-worker-default",
        "/v1/workers",
        "/v1/workers/astro-worker-default/history",
    ] {
        let refused = keda_get(addr, path, Some(WORKER_TOKEN)).await;
        assert_eq!(refused.status, 403, "{path}: {}", refused.body);
    }
    let unknown_queue = keda_get(addr, "/v1/queues/events?queue=nope", Some(WORKER_TOKEN)).await;
    assert_eq!(unknown_queue.status, 404, "{}", unknown_queue.body);
    let no_token = keda_get(addr, "/v1/queues/events?queue=default", None).await;
    assert_eq!(no_token.status, 401);
    // KEDA's token keeps what it had.
    for path in ["/v1/workers/astro-worker-default", "/v1/workers"] {
        let ok = keda_get(addr, path, Some(KEDA_TOKEN)).await;
        assert_eq!(ok.status, 200, "{path}: {}", ok.body);
    }

    let mut stream = open(addr, "queue=default", WORKER_TOKEN).await;
    stream.until("HTTP/1.1 200 OK").await;
    stream.until("content-type: text/event-stream").await;
    stream
        .until(
            "event: subscribed\ndata: {\"queues\":{\"default\":{\"queued\":0,\"running\":2}}}\n\n",
        )
        .await;
    // A task ends: no news. One is queued: a rise.
    fake.set("default", 0, 1);
    fake.set("default", 1, 1);
    stream
        .until("event: rose\ndata: {\"queues\":{\"default\":{\"queued\":1,\"running\":1}}}\n\n")
        .await;
    assert_eq!(
        stream.seen.matches("event: rose").count(),
        1,
        "{}",
        stream.seen
    );

    // KEDA's token may subscribe too; a third stream is over the cap.
    let mut keda_stream = open(addr, "queue=default", KEDA_TOKEN).await;
    keda_stream.until("event: subscribed").await;
    let full = keda_get(addr, "/v1/queues/events?queue=default", Some(WORKER_TOKEN)).await;
    assert_eq!(full.status, 503, "{}", full.body);
    assert!(full.header("retry-after").is_some());

    let metrics = keda_get(addr, "/metrics", None).await.body;
    assert!(
        metrics.contains("astro_sentinel_queue_event_subscribers 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("astro_sentinel_queue_events_sent_total{event=\"rose\"} 1"),
        "{metrics}"
    );
    drop(keda_stream);
    drop(stream);
    eventually(T, "the closed streams' slots back", || async {
        keda_get(addr, "/metrics", None)
            .await
            .body
            .contains("astro_sentinel_queue_event_subscribers 0")
            .then_some(())
    })
    .await;
    sentinel.stop().await;
}
