//! The real `astro-agent` binary subscribed to a scripted Sentinel (a raw TCP server that
//! plays the queue-event stream), against a fake Edge API: a `rose` event wakes an idle agent
//! whose idle intervals are far longer than the test; losing the stream fetches at once; a
//! Sentinel that refuses the token leaves the agent polling as without one.

use std::path::Path;
use std::time::Duration;
use test_kit::agent_process::{start_agent, Agent};
use test_kit::eventually;
use test_kit::fake_edge_api::FakeAirflow;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every wait of the first test is far below the agent's two-minute idle intervals: whatever
/// it fetches within one was woken, not polled.
const T: Duration = Duration::from_secs(20);

/// One connection to the scripted Sentinel, its request read.
struct Connection {
    request: String,
    stream: TcpStream,
}

async fn accept(listener: &TcpListener) -> Connection {
    let (mut stream, _) = tokio::time::timeout(T, listener.accept())
        .await
        .expect("the agent connects to the Sentinel")
        .unwrap();
    let mut request = Vec::new();
    while !request.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        request.push(byte[0]);
    }
    Connection {
        request: String::from_utf8(request).unwrap(),
        stream,
    }
}

impl Connection {
    /// Answers 200 with an event stream whose body ends when the connection closes.
    async fn open(&mut self) {
        self.stream
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
            )
            .await
            .unwrap();
    }

    async fn send(&mut self, event: &str, queued: u64) {
        let text = format!(
            "event: {event}\ndata: {{\"queues\":{{\"default\":{{\"queued\":{queued},\"running\":0}}}}}}\n\n"
        );
        self.stream.write_all(text.as_bytes()).await.unwrap();
    }

    async fn refuse(mut self, status: &str) {
        let body = "{\"error\":\"invalid bearer token\"}";
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        self.stream.write_all(answer.as_bytes()).await.unwrap();
    }
}

async fn metric(agent: &Agent, name: &str) -> Option<f64> {
    let (_, body) = agent.get("/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

async fn until_metric(agent: &Agent, name: &str, value: f64) {
    eventually(T, &format!("{name} {value}"), || async {
        (metric(agent, name).await == Some(value)).then_some(())
    })
    .await
}

/// Starts the agent subscribed to the scripted Sentinel behind `sentinel`: it polls every
/// `idle` without a subscription and every two minutes with one; `extra` are further flags.
async fn start_subscribed(
    fake: &FakeAirflow,
    dir: &Path,
    sentinel: &TcpListener,
    idle: &str,
    extra: &[&str],
) -> Agent {
    let url = format!("http://{}", sentinel.local_addr().unwrap());
    let mut args = vec![
        "--sentinel-url",
        &url,
        "--idle-fetch-interval",
        idle,
        "--subscribed-idle-fetch-interval",
        "120s",
    ];
    args.extend_from_slice(extra);
    start_agent(fake, dir, &args).await
}

fn handed_out(fake: &FakeAirflow, job: &str) -> bool {
    fake.with(|s| s.handed_out.iter().any(|(id, _)| id.ends_with(job)))
}

#[tokio::test]
async fn an_idle_agent_is_woken_by_the_sentinel_and_fetches_at_once_when_the_stream_is_lost() {
    let fake = FakeAirflow::start().await;
    let sentinel = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "agent-token\n").unwrap();
    let agent = start_subscribed(
        &fake,
        dir.path(),
        &sentinel,
        "120s",
        &["--sentinel-token-file", token.to_str().unwrap()],
    )
    .await;
    let mut first = accept(&sentinel).await;
    assert!(
        first
            .request
            .starts_with("GET /v1/queues/events?queue=default HTTP/1.1\r\n"),
        "{}",
        first.request
    );
    assert!(
        first
            .request
            .to_ascii_lowercase()
            .contains("authorization: bearer agent-token\r\n"),
        "{}",
        first.request
    );
    first.open().await;
    first.send("subscribed", 0).await;
    until_metric(&agent, "astro_agent_sentinel_subscribed", 1.0).await;
    // The agent's first fetch found nothing, and it now waits two minutes unless woken.
    agent
        .until(&fake, "the first fetch", T, |s| s.fetches >= 1)
        .await;

    fake.add_job("woken", 0.1, 0);
    first.send("rose", 1).await;
    agent
        .until(&fake, "the woken job handed out", T, |s| {
            s.handed_out.iter().any(|(id, _)| id.ends_with("woken"))
        })
        .await;
    until_metric(&agent, "astro_agent_wakeups_total", 1.0).await;

    // Work queued with no event, then the stream breaks: the agent fetches at once.
    fake.add_job("after-loss", 0.1, 0);
    assert!(!handed_out(&fake, "after-loss"));
    drop(first);
    agent
        .until(&fake, "the job queued before the loss handed out", T, |s| {
            s.handed_out
                .iter()
                .any(|(id, _)| id.ends_with("after-loss"))
        })
        .await;
    until_metric(&agent, "astro_agent_sentinel_subscribed", 0.0).await;

    // It reconnects; what was queued meanwhile is fetched on the first state it hears.
    let mut second = accept(&sentinel).await;
    fake.add_job("while-away", 0.1, 0);
    second.open().await;
    second.send("subscribed", 1).await;
    agent
        .until(&fake, "the job queued while away handed out", T, |s| {
            s.handed_out
                .iter()
                .any(|(id, _)| id.ends_with("while-away"))
        })
        .await;
    until_metric(&agent, "astro_agent_sentinel_subscribed", 1.0).await;
    assert_eq!(
        metric(&agent, "astro_agent_wakeups_total").await,
        Some(1.0),
        "only the rose event counts as a wake-up"
    );
    let log = agent.log();
    assert_eq!(
        log.matches("no Sentinel subscription").count(),
        1,
        "each change logged once:\n{log}"
    );
    assert_eq!(
        log.matches("subscribed to the Sentinel").count(),
        2,
        "{log}"
    );
}

#[tokio::test]
async fn a_sentinel_that_refuses_the_token_leaves_the_agent_polling() {
    let fake = FakeAirflow::start().await;
    let sentinel = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = start_subscribed(&fake, dir.path(), &sentinel, "300ms", &[]).await;
    let refusing = tokio::spawn(async move {
        loop {
            accept(&sentinel).await.refuse("401 Unauthorized").await;
        }
    });
    for job in ["one", "two"] {
        fake.add_job(job, 0.1, 0);
        agent
            .until(&fake, "the job handed out by polling", T, |s| {
                s.handed_out.iter().any(|(id, _)| id.ends_with(job))
            })
            .await;
    }
    assert_eq!(
        metric(&agent, "astro_agent_sentinel_subscribed").await,
        Some(0.0)
    );
    let before = fake.with(|s| s.fetches);
    agent
        .until(&fake, "polling goes on", T, |s| s.fetches >= before + 3)
        .await;
    refusing.abort();
    let log = agent.log();
    assert!(log.contains("401"), "{log}");
    assert_eq!(
        log.matches("no Sentinel subscription").count(),
        1,
        "the same refusal is logged once:\n{log}"
    );
}

#[tokio::test]
async fn a_queue_change_by_airflow_resubscribes_to_the_new_queues() {
    let fake = FakeAirflow::start().await;
    let sentinel = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = start_subscribed(&fake, dir.path(), &sentinel, "120s", &[]).await;
    let mut first = accept(&sentinel).await;
    assert!(
        first.request.contains("?queue=default HTTP"),
        "{}",
        first.request
    );
    first.open().await;
    first.send("subscribed", 0).await;
    until_metric(&agent, "astro_agent_sentinel_subscribed", 1.0).await;

    fake.with(|s| s.heartbeat_answer_queues = Some(vec!["default".into(), "extra".into()]));
    let second = accept(&sentinel).await;
    assert!(
        second
            .request
            .starts_with("GET /v1/queues/events?queue=default&queue=extra HTTP/1.1\r\n"),
        "{}",
        second.request
    );
    drop(first);
}
