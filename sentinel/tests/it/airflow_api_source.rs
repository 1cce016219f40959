//! The airflow-api source on its own: every queue answered, failures per queue, and a refresh
//! time budget so that one api-server call that never returns does not hold the rest, while a
//! large backlog whose pages keep coming is read to the end. Executor callbacks are added to
//! their queue as the Edge executor counts them.

use airflow::rest_api::RestCredentials;
use astro_sentinel::sources::airflow_api::AirflowApiSource;
use astro_sentinel::sources::{BacklogSource, QueueBacklog};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use test_kit::fake_rest_api::{fake_airflow, FakeInstance};

fn source(
    addr: std::net::SocketAddr,
    budget: Duration,
) -> (AirflowApiSource, prometheus::IntCounter) {
    let requests = prometheus::IntCounter::new("requests", "test").unwrap();
    let url = url::Url::parse(&format!("http://{addr}")).unwrap();
    let s = AirflowApiSource::new(
        &url,
        RestCredentials::Token("airflow-token".into()),
        requests.clone(),
        None,
    )
    .unwrap()
    .with_budget(budget);
    (s, requests)
}

#[tokio::test]
async fn each_queue_gets_its_own_outcome() {
    let (fake, server) = fake_airflow().await;
    fake.set("a", 3, 4);
    fake.fail("b", true);
    let (s, requests) = source(server.addr, Duration::from_secs(10));
    let queues: Vec<String> = ["a", "b", "c"].iter().map(|q| q.to_string()).collect();
    let out: HashMap<String, _> = s.fetch(&queues).await.into_iter().collect();
    assert_eq!(out.len(), 3);
    assert_eq!(
        out["a"],
        Ok(QueueBacklog {
            queued_tasks: 3,
            running_tasks: 4,
            queued_slots: 3,
            running_slots: 4,
            oldest_queued_age: out["a"].as_ref().unwrap().oldest_queued_age,
        })
    );
    assert!(
        out["b"].as_ref().unwrap_err().contains("500"),
        "{:?}",
        out["b"]
    );
    assert_eq!(
        out["c"],
        Ok(QueueBacklog::default()),
        "no task instance is a true 0"
    );
    // One page for each of the three queues, and the list of executor callbacks (none: this
    // provider has no such list).
    assert_eq!(requests.get(), 4);
    let user_agent = fake.user_agent.lock().unwrap().clone();
    assert!(user_agent.starts_with("astro-sentinel/"), "{user_agent}");
}

#[tokio::test]
async fn a_hanging_call_does_not_hold_the_other_queues() {
    let (fake, server) = fake_airflow().await;
    fake.set("fast", 1, 2);
    fake.hang("slow");
    let (s, _) = source(server.addr, Duration::from_millis(500));
    let queues: Vec<String> = ["fast", "slow"].iter().map(|q| q.to_string()).collect();
    let started = Instant::now();
    let out: HashMap<String, _> = s.fetch(&queues).await.into_iter().collect();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        out["fast"],
        Ok(QueueBacklog {
            queued_tasks: 1,
            running_tasks: 2,
            queued_slots: 1,
            running_slots: 2,
            oldest_queued_age: out["fast"].as_ref().unwrap().oldest_queued_age,
        })
    );
    assert!(
        out["slow"].as_ref().unwrap_err().contains("budget"),
        "{:?}",
        out["slow"]
    );
}

#[tokio::test]
async fn a_wrong_token_is_a_failure_not_a_zero() {
    let (fake, server) = fake_airflow().await;
    fake.set("a", 5, 0);
    *fake.token.lock().unwrap() = "another-token".into();
    let (s, _) = source(server.addr, Duration::from_secs(10));
    let out = s.fetch(&["a".to_string()]).await;
    assert!(
        out[0].1.as_ref().unwrap_err().contains("401"),
        "{:?}",
        out[0].1
    );
}

/// RFC 3339 for `ago` before now.
fn rfc3339_ago(ago: Duration) -> String {
    let at = chrono::Utc::now() - chrono::Duration::from_std(ago).unwrap();
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

#[tokio::test]
async fn slots_tasks_and_the_oldest_wait_come_from_every_page() {
    let (fake, server) = fake_airflow().await;
    // 250 task instances over three pages of 100: 150 queued alternating 1 and 3 slots, the
    // longest-waiting one last; 100 running of 2 slots.
    let mut listed: Vec<FakeInstance> = (0..149)
        .map(|i| {
            FakeInstance::queued(
                if i % 2 == 0 { 1 } else { 3 },
                &rfc3339_ago(Duration::from_secs(5)),
            )
        })
        .collect();
    listed.extend((0..100).map(|_| FakeInstance::running(2)));
    listed.push(FakeInstance::queued(
        3,
        &rfc3339_ago(Duration::from_secs(600)),
    ));
    fake.set_instances("mixed", listed);
    let (s, requests) = source(server.addr, Duration::from_secs(10));
    let out = s.fetch(&["mixed".to_string()]).await;
    let b = out[0].1.clone().unwrap();
    assert_eq!((b.queued_tasks, b.running_tasks), (150, 100));
    assert_eq!(b.queued_slots, 75 + 74 * 3 + 3);
    assert_eq!(b.running_slots, 200);
    let waited = b.oldest_queued_age.unwrap();
    assert!(
        (Duration::from_secs(600)..Duration::from_secs(610)).contains(&waited),
        "{waited:?}"
    );
    assert_eq!(
        requests.get(),
        4,
        "ceil(250 / 100) pages, and the callbacks"
    );
    assert_eq!(fake.requests(), 3);
}

#[tokio::test]
async fn nothing_queued_has_no_oldest_wait() {
    let (fake, server) = fake_airflow().await;
    fake.set_instances("busy", vec![FakeInstance::running(4)]);
    let (s, _) = source(server.addr, Duration::from_secs(10));
    let out = s.fetch(&["busy".to_string()]).await;
    assert_eq!(
        out[0].1,
        Ok(QueueBacklog {
            running_tasks: 1,
            running_slots: 4,
            ..QueueBacklog::default()
        })
    );
}

#[tokio::test]
async fn a_long_listing_that_keeps_answering_outlasts_the_budget() {
    let (fake, server) = fake_airflow().await;
    fake.set("big", 1000, 0);
    // 10 pages, each answered after 300 ms, 4 at a time after the first: about 1.2 s in all,
    // over twice the budget, but never 500 ms without an answer.
    fake.slow("big", Duration::from_millis(300));
    let (s, requests) = source(server.addr, Duration::from_millis(500));
    let started = Instant::now();
    let out = s.fetch(&["big".to_string()]).await;
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let b = out[0].1.as_ref().expect("read to the end");
    assert_eq!((b.queued_tasks, b.queued_slots), (1000, 1000));
    assert_eq!(requests.get(), 11, "10 pages, and the callbacks");
}

#[tokio::test]
async fn a_count_without_a_listing_is_a_failure_not_a_zero() {
    let (fake, server) = fake_airflow().await;
    fake.set("counted", 5, 0);
    fake.list_nothing("counted");
    let (s, _) = source(server.addr, Duration::from_secs(10));
    let out = s.fetch(&["counted".to_string()]).await;
    let error = out[0].1.as_ref().unwrap_err();
    assert!(
        error.contains("counts 5") && error.contains("lists none"),
        "{error}"
    );
}

/// One row of the provider's job list: a callback (`ExecuteCallback-<id>` run), or a task.
fn edge_job(dag_id: &str, id: &str, run_id: &str, state: &str, queue: &str) -> serde_json::Value {
    serde_json::json!({
        "dag_id": dag_id, "task_id": id, "run_id": run_id, "map_index": -1, "try_number": 0,
        "task_instance_id": "", "state": state, "queue": queue,
        "queued_dttm": rfc3339_ago(Duration::from_secs(if state == "queued" { 900 } else { 1 })),
        "edge_worker": null, "last_update": null,
    })
}

#[tokio::test]
async fn callbacks_count_as_one_slot_jobs_on_their_queue() {
    let (fake, server) = fake_airflow().await;
    fake.set_instances(
        "default",
        vec![
            FakeInstance::queued(2, &rfc3339_ago(Duration::from_secs(5))),
            FakeInstance::running(3),
        ],
    );
    fake.set_edge_jobs(vec![
        edge_job(
            "ExecuteCallback",
            "c1",
            "ExecuteCallback-c1",
            "queued",
            "default",
        ),
        edge_job(
            "ExecuteCallback",
            "c2",
            "ExecuteCallback-c2",
            "running",
            "default",
        ),
        edge_job(
            "ExecuteCallback",
            "c3",
            "ExecuteCallback-c3",
            "queued",
            "other",
        ),
        // A DAG that happens to be called ExecuteCallback: its task is counted as a task
        // instance, not again as a callback.
        edge_job("ExecuteCallback", "t", "manual__1", "queued", "default"),
    ]);
    let (s, requests) = source(server.addr, Duration::from_secs(10));
    let out: HashMap<String, _> = s
        .fetch(&["default".to_string()])
        .await
        .into_iter()
        .collect();
    let b = out["default"].clone().unwrap();
    assert_eq!((b.queued_tasks, b.running_tasks), (2, 2));
    assert_eq!((b.queued_slots, b.running_slots), (3, 4));
    let waited = b.oldest_queued_age.unwrap();
    assert!(
        (Duration::from_secs(900)..Duration::from_secs(910)).contains(&waited),
        "the queued callback waited longest: {waited:?}"
    );
    assert_eq!(
        requests.get(),
        2,
        "one page, and the callbacks of every queue"
    );
}

#[tokio::test]
async fn an_unanswered_callback_list_fails_every_queue_rather_than_leave_them_out() {
    let (fake, server) = fake_airflow().await;
    fake.set("a", 1, 0);
    fake.edge_jobs_answer(Some(500));
    let (s, _) = source(server.addr, Duration::from_secs(10));
    let out = s.fetch(&["a".to_string()]).await;
    let error = out[0].1.as_ref().unwrap_err();
    assert!(
        error.contains("executor callbacks") && error.contains("500"),
        "{error}"
    );
}

#[tokio::test]
async fn a_callback_list_closed_to_the_sentinel_leaves_the_task_instances() {
    let (fake, server) = fake_airflow().await;
    fake.set("a", 1, 2);
    fake.edge_jobs_answer(Some(403));
    let (s, _) = source(server.addr, Duration::from_secs(10));
    let out = s.fetch(&["a".to_string()]).await;
    let b = out[0].1.clone().unwrap();
    assert_eq!((b.queued_tasks, b.running_tasks), (1, 2));
}
