//! The real `astro-agent` binary against a fake Edge API that checks versions as the edge3
//! provider does: the agent reports what Airflow runs, retries what may pass, and exits 2 with
//! one line for an Airflow it cannot serve.

use nix::sys::signal::Signal;
use std::time::Duration;
use test_kit::agent_process::{start_agent, start_negotiating_agent, Agent};
use test_kit::fake_edge_api::FakeAirflow;

const T: Duration = Duration::from_secs(20);

/// The agent's stderr lines that say why it stopped.
fn error_lines(agent: &Agent) -> Vec<String> {
    agent
        .log()
        .lines()
        .filter(|l| l.starts_with("astro-agent:"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn the_versions_airflow_runs_are_learnt_and_reported_in_heartbeats() {
    let fake = FakeAirflow::start().await;
    fake.with(|s| {
        s.airflow_version = Some("3.2.2".into());
        s.edge_provider_version = Some("4.3.2".into());
        // The api-server is not up yet: asked again with backoff, not given up on.
        s.fail_versions = 2;
    });
    fake.add_job("after-negotiation", 0.1, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_negotiating_agent(&fake, dir.path(), &[]).await;
    agent
        .until(&fake, "a job run after registering", T, |s| {
            s.finished.len() == 1 && !s.heartbeat_sysinfo.is_empty()
        })
        .await;
    fake.with(|s| {
        assert_eq!(s.version_requests, 3, "two 503s, then the answer");
        // The first registration reports no Edge provider Airflow knows; its refusal names
        // Airflow's, which the second reports.
        let reported = |sysinfo: &serde_json::Value| {
            (
                sysinfo["airflow_version"].as_str().unwrap().to_string(),
                sysinfo["edge_provider_version"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        };
        assert_eq!(s.registers, 2, "{:?}", s.registered_sysinfo);
        assert_eq!(
            reported(&s.registered_sysinfo[1]),
            ("3.2.2".into(), "4.3.2".into())
        );
        for sysinfo in &s.heartbeat_sysinfo {
            assert_eq!(reported(sysinfo), ("3.2.2".into(), "4.3.2".into()));
        }
        assert_eq!(s.states["after-negotiation"].last().unwrap(), "success");
    });
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
    assert!(error_lines(&agent).is_empty(), "{}", agent.log());
}

#[tokio::test]
async fn an_edge_provider_upgraded_under_a_running_worker_is_followed_without_a_drain() {
    let fake = FakeAirflow::start().await;
    fake.with(|s| {
        s.airflow_version = Some("3.3.2".into());
        s.edge_provider_version = Some("5.1.0".into());
    });
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_negotiating_agent(&fake, dir.path(), &[]).await;
    agent
        .until(&fake, "registered and beating", T, |s| {
            !s.heartbeats.is_empty()
        })
        .await;
    let edge_provider = |s: &test_kit::fake_edge_api::State| {
        s.heartbeat_sysinfo.last().unwrap()["edge_provider_version"]
            .as_str()
            .unwrap()
            .to_string()
    };
    fake.with(|s| s.edge_provider_version = Some("5.2.0".into()));
    agent
        .until(&fake, "a heartbeat with the new version", T, |s| {
            edge_provider(s) == "5.2.0"
        })
        .await;
    fake.add_job("after-upgrade", 0.1, 0);
    agent
        .until(&fake, "the next job runs", T, |s| s.finished.len() == 1)
        .await;
    fake.with(|s| assert_eq!(s.states["after-upgrade"].last().unwrap(), "success"));
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
    assert!(error_lines(&agent).is_empty(), "{}", agent.log());
}

#[tokio::test]
async fn an_airflow_2_is_one_line_and_exit_2_without_registering() {
    let fake = FakeAirflow::start().await;
    fake.with(|s| s.airflow_2_version = Some("2.10.5".into()));
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_negotiating_agent(&fake, dir.path(), &[]).await;
    assert_eq!(agent.exit_code(T).await, 2, "{}", agent.log());
    let lines = error_lines(&agent);
    assert_eq!(lines.len(), 1, "{}", agent.log());
    assert!(
        lines[0].contains("2.10.5") && lines[0].contains("--api-url"),
        "{lines:?}"
    );
    assert!(
        !agent.log().contains("registration failed"),
        "{}",
        agent.log()
    );
    fake.with(|s| assert_eq!(s.registers, 0));
}

#[tokio::test]
async fn an_edge_provider_older_than_the_oldest_supported_is_one_line_and_exit_2() {
    let fake = FakeAirflow::start().await;
    fake.with(|s| {
        s.airflow_version = Some("3.3.2".into());
        s.edge_provider_version = Some("0.9.0".into());
    });
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_negotiating_agent(&fake, dir.path(), &[]).await;
    assert_eq!(agent.exit_code(T).await, 2, "{}", agent.log());
    let lines = error_lines(&agent);
    assert_eq!(lines.len(), 1, "{}", agent.log());
    assert!(
        lines[0].contains("0.9.0") && lines[0].contains("1.0.0"),
        "{lines:?}"
    );
    fake.with(|s| assert_eq!(s.registers, 1, "refused once, not retried"));
}

#[tokio::test]
async fn a_version_flag_airflow_refuses_is_one_line_naming_it_and_exit_2() {
    let fake = FakeAirflow::start().await;
    // The agent is told 5.1.0 by its flag; Airflow runs another.
    fake.with(|s| s.edge_provider_version = Some("5.0.0".into()));
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &[]).await;
    assert_eq!(agent.exit_code(T).await, 2, "{}", agent.log());
    let lines = error_lines(&agent);
    assert_eq!(lines.len(), 1, "{}", agent.log());
    assert!(
        lines[0].contains("--edge-provider-version") && lines[0].contains("5.0.0"),
        "{lines:?}"
    );
    fake.with(|s| assert_eq!(s.registers, 1, "refused once, not retried"));
}
