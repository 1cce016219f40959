//! The airflow-api source on its own: every queue answered, failures per queue, and a refresh
//! time budget so that one api-server call that never returns does not hold the rest.

mod common;

use airflow::rest_api::{QueueCounts, RestCredentials};
use astro_sentinel::airflow_api_source::AirflowApiSource;
use astro_sentinel::backlog_source::BacklogSource;
use common::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

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
        Ok(QueueCounts {
            queued: 3,
            running: 4
        })
    );
    assert!(
        out["b"].as_ref().unwrap_err().contains("500"),
        "{:?}",
        out["b"]
    );
    assert_eq!(
        out["c"],
        Ok(QueueCounts::default()),
        "no task instance is a true 0"
    );
    // queued + running for each of the three queues (b's second request may be cancelled
    // once its first one failed, but it is counted when sent).
    assert!((5..=6).contains(&requests.get()), "{}", requests.get());
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
        Ok(QueueCounts {
            queued: 1,
            running: 2
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
