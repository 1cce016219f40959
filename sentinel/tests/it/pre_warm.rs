//! Pre-warm end to end in-process: the real refresh loop, cache and HTTP server over a fake
//! Airflow for the backlog and a fake schedule, through `Running::read_schedule` as the binary
//! wires it. A DAG due in two seconds opens its window at once (lead 30 s): the answer carries
//! its expected slots apart from the backlog, `/metrics` too; once its work is queued after
//! `run_after`, the real backlog takes over and the history says what happened.

use crate::common::*;
use airflow::dag_schedule::{DagTask, ListedDag};
use astro_sentinel::schedule::reader::{RecentRuns, ScheduleSource};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use test_kit::eventually;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;

const YAML: &str = "refreshInterval: 100ms
auth: {disabled: true}
schedule: {readInterval: 5s}
workers:
  - {name: w, queues: [default], syncSlots: 4, maxReplicas: 10, preWarm: {lead: 30s}}
  - {name: off, queues: [default], syncSlots: 4, preWarm: {enabled: false}}
";

/// One DAG with a three-slot task on `default`, never run, due at `run_after`.
struct OneDag {
    run_after: String,
}

impl ScheduleSource for OneDag {
    fn unpaused_dags(&self) -> BoxFuture<'_, Result<Vec<ListedDag>, String>> {
        let dag = ListedDag {
            dag_id: "etl_daily".into(),
            is_paused: false,
            next_dagrun_run_after: Some(self.run_after.clone()),
        };
        std::future::ready(Ok(vec![dag])).boxed()
    }
    fn dag_tasks<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<DagTask>, String>> {
        let task = DagTask {
            task_id: Some("load".into()),
            queue: Some("default".into()),
            pool_slots: Some(3.0),
        };
        std::future::ready(Ok(vec![task])).boxed()
    }
    fn recent_runs<'a>(
        &'a self,
        _: &'a str,
        _: &'a [String],
    ) -> BoxFuture<'a, Result<RecentRuns, String>> {
        std::future::ready(Ok(RecentRuns::default())).boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expected_slots_lead_a_scheduled_run_until_its_work_is_queued() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("default", 0, 0);
    let mut sentinel = start_against(upstream.addr, YAML, None).await;
    let run_after = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(2));
    sentinel
        .read_schedule(Arc::new(OneDag {
            run_after: run_after.to_string(),
        }))
        .await;
    let addr = sentinel.addr();

    let warm = eventually(Duration::from_secs(5), "expected slots", || async {
        let a = keda_get(addr, "/v1/workers/w", None).await;
        (a.status == 200 && a.json()["expectedSlots"] == 3).then(|| a.json())
    })
    .await;
    assert_eq!(warm["backlog"], 0);
    assert_eq!(warm["desiredReplicas"], 1, "ceil(3 / 4)");
    assert_eq!(
        warm["expectedFor"],
        serde_json::json!([{"dag": "etl_daily", "runAfter": run_after.to_string()}])
    );
    let off = keda_get(addr, "/v1/workers/off", None).await.json();
    assert_eq!(
        (
            off["expectedSlots"].as_u64(),
            off["desiredReplicas"].as_u64()
        ),
        (Some(0), Some(0))
    );
    let metrics = keda_get(addr, "/metrics", None).await.body;
    assert!(
        metrics.contains("astro_sentinel_worker_expected_slots{worker=\"w\"} 3"),
        "{metrics}"
    );

    // The run's task is queued: the real backlog takes over, once run_after has come.
    fake.set("default", 1, 0);
    let taken_over = eventually(
        Duration::from_secs(10),
        "the backlog to take over",
        || async {
            let a = keda_get(addr, "/v1/workers/w", None).await;
            (a.status == 200 && a.json()["expectedSlots"] == 0).then(|| a.json())
        },
    )
    .await;
    assert!(SystemTime::now() >= humantime::parse_rfc3339(&run_after.to_string()).unwrap());
    assert_eq!(
        (
            taken_over["backlog"].as_u64(),
            taken_over["desiredReplicas"].as_u64()
        ),
        (Some(1), Some(1))
    );

    let history = keda_get(addr, "/v1/workers/w/history?range=15m", None)
        .await
        .json();
    let entries = history["preWarm"]["entries"].as_array().unwrap().clone();
    let outcomes: Vec<&str> = entries
        .iter()
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["opened", "workArrived"]);
    let opened = entries[0]["text"].as_str().unwrap();
    assert!(opened.starts_with("pre-warmed 1 worker at "), "{opened}");
    assert!(opened.contains(" for etl_daily (runs at "), "{opened}");
    assert!(
        opened.ends_with("; never run yet: its tasks on these queues take 3 slots, counted up to one worker's 4 slots)"),
        "{opened}"
    );
    sentinel.stop().await;
}
