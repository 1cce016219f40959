//! `GET /v1/workers/{name}/history` end to end in-process: a fake Airflow REST API upstream,
//! the real airflow-api source, refresh loop, history, static-token auth and HTTP server; and
//! the history file across a restart, including a corrupt one.

use crate::common::*;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::{eventually, Answer, TempDir};

const TOKEN: &str = "history-reader-token";
const WORKER: &str = "/v1/workers/astro-worker-default/history";

fn yaml(tokens: &Path, history_path: Option<&Path>) -> String {
    let history = history_path
        .map(|p| format!("history:\n  path: {}\n", p.display()))
        .unwrap_or_default();
    format!(
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
{history}",
        tokens.display()
    )
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    keda_get(addr, path, Some(TOKEN)).await
}

/// Waits until the answer at `path` satisfies `done`, and returns it.
async fn history_until(
    addr: SocketAddr,
    path: &str,
    what: &str,
    done: fn(&Value) -> bool,
) -> Value {
    // Generous: the at-maximum finding alone needs 9.4 s of recorded time.
    eventually(Duration::from_secs(30), what, || async {
        let a = get(addr, path).await;
        assert_eq!(a.status, 200, "{}", a.body);
        let body = a.json();
        done(&body).then_some(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_shows_series_tiles_findings_and_decisions() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("default", 8, 4);
    let dir = TempDir::new("history");
    let tokens = dir.file("tokens", TOKEN);
    let sentinel = start_against(upstream.addr, &yaml(&tokens, None), None).await;
    let addr = sentinel.addr();

    let body = history_until(addr, &format!("{WORKER}?range=15m"), "a first point", |b| {
        !b["series"].as_array().unwrap().is_empty()
    })
    .await;
    assert_eq!(body["worker"], "astro-worker-default");
    assert_eq!(body["range"], "15m");
    assert_eq!(body["stepSeconds"], 10);
    assert_eq!(
        (
            &body["minReplicas"],
            &body["maxReplicas"],
            &body["syncSlots"]
        ),
        (&json!(1), &json!(5), &json!(4))
    );
    assert!(!body["recordedBy"].as_str().unwrap().is_empty());
    assert!(body["recordingSince"].as_str().unwrap().ends_with('Z'));
    assert!(body["from"].as_str().unwrap() < body["to"].as_str().unwrap());
    assert_eq!(
        body["missing"],
        json!(["workers", "running", "waiting", "terminating"]),
        "no Kubernetes source: said, not drawn as 0"
    );
    let point = &body["series"][0];
    assert_eq!(point["wanted"], 3, "ceil(12 / 4)");
    assert_eq!(point["desiredReplicas"], 3);
    assert_eq!(point["workers"], Value::Null);
    assert_eq!(
        (&point["backlog"], &point["queued"], &point["runningTasks"]),
        (&json!(12), &json!(8), &json!(4))
    );
    assert_eq!(body["tiles"]["peakWanted"], 3);
    assert_eq!(body["tiles"]["atMaximumSeconds"], 0);
    assert_eq!(body["tiles"]["waitingForCapacitySeconds"], Value::Null);
    assert_eq!(body["findings"][0]["kind"], "withinRange");
    assert_eq!(body["decisions"], json!([]));
    // Outside Kubernetes only Airflow's phases of a cold start, and no start has happened.
    assert_eq!(
        body["coldStarts"],
        json!({"phases": ["backlogSeen", "agentRegistered", "firstTaskRunning"],
               "starts": [], "totalP50Ms": null, "totalP90Ms": null})
    );

    // A burst: wanted 10, held at the maximum of 5.
    fake.set("default", 30, 10);
    let body = history_until(addr, &format!("{WORKER}?range=15m"), "the decision", |b| {
        !b["decisions"].as_array().unwrap().is_empty()
    })
    .await;
    let d = &body["decisions"][0];
    assert_eq!(
        (&d["what"], &d["from"], &d["to"], &d["source"]),
        (
            &json!("desiredReplicas"),
            &json!(3),
            &json!(5),
            &json!("airflow-api")
        )
    );
    assert_eq!(d["formula"], "ceil(40 / 4) = 10, held within 1..5 at 5");
    assert_eq!((&d["queued"], &d["runningTasks"]), (&json!(30), &json!(10)));
    assert_eq!(
        body["tiles"]["peakWanted"], 10,
        "wanted is not held at the maximum"
    );

    // The 15 minutes threshold scaled to 15 minutes is 9.375 s: at a 100 ms cadence the
    // finding shows up after about ten seconds at the maximum.
    let body = history_until(addr, &format!("{WORKER}?range=15m"), "the finding", |b| {
        b["findings"][0]["kind"] == "atMaximum"
    })
    .await;
    assert!(body["findings"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("Ran at its maximum of 5 workers for "));
    assert!(body["tiles"]["atMaximumSeconds"].as_u64().unwrap() >= 9);

    let default = get(addr, WORKER).await;
    assert_eq!(default.status, 200);
    assert_eq!(default.json()["range"], "1d");
    assert_eq!(default.json()["stepSeconds"], 60);
    for range in ["1h", "6h", "7d", "14d"] {
        let a = get(addr, &format!("{WORKER}?range={range}")).await;
        assert_eq!(a.status, 200, "{range}: {}", a.body);
        assert_eq!(a.json()["range"], range);
        assert!(
            !a.json()["series"].as_array().unwrap().is_empty(),
            "{range}"
        );
    }

    let bad = get(addr, &format!("{WORKER}?range=2d")).await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.json()["error"].as_str().unwrap().starts_with("range:"),
        "{}",
        bad.body
    );
    let unknown = get(addr, "/v1/workers/nope/history").await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let anonymous = keda_get(addr, WORKER, None).await;
    assert_eq!(anonymous.status, 401);
    let wrong = keda_get(addr, WORKER, Some("not-the-token")).await;
    assert_eq!(wrong.status, 401);
    // The worker itself still answers as before.
    let worker = get(addr, "/v1/workers/astro-worker-default").await;
    assert_eq!(worker.status, 200);

    sentinel.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_file_carries_the_recording_across_a_restart() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("default", 2, 2);
    let dir = TempDir::new("history-file");
    let tokens = dir.file("tokens", TOKEN);
    let file = dir.0.join("history.bin");
    let config = yaml(&tokens, Some(&file));

    let first = start_against(upstream.addr, &config, None).await;
    let before = history_until(first.addr(), &format!("{WORKER}?range=1h"), "points", |b| {
        b["series"].as_array().unwrap().len() >= 2
    })
    .await;
    first.stop().await;
    assert!(file.exists(), "saved on shutdown");

    // Upstream down: whatever the restarted Sentinel shows came from the file.
    fake.fail("default", true);
    let second = start_against(upstream.addr, &config, None).await;
    let after = get(second.addr(), &format!("{WORKER}?range=1h"))
        .await
        .json();
    assert_eq!(after["recordingSince"], before["recordingSince"]);
    let series = after["series"].as_array().unwrap();
    assert!(series.len() >= 2, "{after}");
    assert_eq!(series[0], before["series"][0]);
    second.stop().await;

    // A corrupt file: logged and ignored, the Sentinel starts and records afresh.
    std::fs::write(
        &file,
        b"ASTROHST\x01\x00\x00\x00 this is not a checksum nor a payload",
    )
    .unwrap();
    fake.fail("default", false);
    let third = start_against(upstream.addr, &config, None).await;
    let fresh = get(third.addr(), &format!("{WORKER}?range=1h"))
        .await
        .json();
    assert_ne!(fresh["recordingSince"], before["recordingSince"]);
    history_until(
        third.addr(),
        &format!("{WORKER}?range=1h"),
        "recording again",
        |b| !b["series"].as_array().unwrap().is_empty(),
    )
    .await;
    third.stop().await;
    let saved = std::fs::read(&file).unwrap();
    assert!(saved.len() > 44, "replaced by a real history file");
}

#[tokio::test]
async fn a_history_path_in_a_missing_folder_is_refused_naming_the_field() {
    let (_fake, upstream) = fake_airflow().await;
    let dir = TempDir::new("history-folder");
    let tokens = dir.file("tokens", TOKEN);
    let missing = dir.0.join("no-such-folder").join("history.bin");
    let error = match try_start_against(upstream.addr, &yaml(&tokens, Some(&missing)), None).await {
        Ok(_) => panic!("started with a history file in a missing folder"),
        Err(e) => e.to_string(),
    };
    assert!(error.starts_with("history.path:"), "{error}");
}
