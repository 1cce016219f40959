//! The airflow-api source on its own: every queue answered, failures per queue, and a refresh
//! time budget so that one api-server call that never returns does not hold the rest, while a
//! large backlog whose pages keep coming is read to the end.

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
    // One page for each of the three queues.
    assert_eq!(requests.get(), 3);
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
    assert_eq!(requests.get(), 3, "ceil(250 / 100) pages");
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
    assert_eq!(requests.get(), 10);
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
