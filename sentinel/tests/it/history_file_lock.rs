//! Two `astro-sentinel` processes on one history file: one writes it, the other keeps its
//! history in memory; when the writer stops, the other takes the file over — it continues
//! the writer's record (loaded from the file) and writes from then on.

use std::path::Path;
use std::time::Duration;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::sentinel_process::SentinelProcess;
use test_kit::{eventually, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_astro-sentinel");
const OWNER: &str = "astro_sentinel_history_file_owner";

async fn recording_since(sentinel: &SentinelProcess) -> Option<String> {
    let a = keda_get(sentinel.addr, "/v1/workers/w/history?range=15m", None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["historyKept"], "volume");
    a.json()["recordingSince"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_writes_and_the_other_takes_over_when_it_stops() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("q", 2, 1);
    let dir = TempDir::new("history-lock");
    let history = dir.0.join("history.bin");
    let config = dir.file(
        "config.yaml",
        &format!(
            "refreshInterval: 100ms
source: {{type: airflow-api, airflowApi: {{url: \"http://{}\"}}}}
auth: {{disabled: true}}
history: {{path: {}}}
workers:
  - {{name: w, queues: [q]}}
",
            upstream.addr,
            history.display()
        ),
    );
    let env = [("ASTRO_SENTINEL_AIRFLOW_TOKEN", "airflow-token")];
    let mut first = SentinelProcess::start(Path::new(BIN), &config, &[], &env);
    assert_eq!(first.metric(OWNER).await, Some(1.0), "the first one writes");
    let first_since = eventually(Duration::from_secs(10), "a first recording", || async {
        recording_since(&first).await
    })
    .await;

    let mut second = SentinelProcess::start(Path::new(BIN), &config, &[], &env);
    assert_eq!(
        second.metric(OWNER).await,
        Some(0.0),
        "the file has its writer"
    );
    let second_since = eventually(Duration::from_secs(10), "its own recording", || async {
        recording_since(&second).await
    })
    .await;
    let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap();
    assert!(
        at(&second_since) > at(&first_since),
        "{second_since} vs {first_since}"
    );

    assert_eq!(first.stop(), 0);
    eventually(Duration::from_secs(15), "the file taken over", || async {
        (second.metric(OWNER).await == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(
        recording_since(&second).await.as_deref(),
        Some(first_since.as_str()),
        "the second continues the first's record"
    );
    // Its log is read from stderr by another thread: it may trail the metric.
    eventually(Duration::from_secs(15), "the takeover logged", || async {
        second
            .log()
            .iter()
            .any(|l| l.contains("continuing its record"))
            .then_some(())
    })
    .await;
    assert_eq!(second.stop(), 0);
    assert!(history.exists());
}
