//! The real `astro-agent` binary against a fake Edge API: slots, refill, drain, signals,
//! deadline, faults and configuration errors.

use nix::sys::signal::Signal;
use std::time::{Duration, Instant};
use test_kit::agent_process::{max_task_processes, start_agent};
use test_kit::fake_edge_api::FakeAirflow;

const T: Duration = Duration::from_secs(20);

fn final_state(states: &[String]) -> Option<&str> {
    states
        .last()
        .map(String::as_str)
        .filter(|s| *s != "running")
}

#[tokio::test]
async fn never_more_than_sync_slots_and_freed_slots_refill_at_once() {
    let fake = FakeAirflow::start().await;
    for i in 0..12 {
        fake.add_job(&format!("t{i}"), 0.4, 0);
    }
    let dir = tempfile::tempdir().unwrap();
    // An idle interval of a minute: finishing 12 tasks quickly proves that a freed slot
    // triggers the next fetch by itself.
    let mut agent = start_agent(
        &fake,
        dir.path(),
        &["--sync-slots", "3", "--idle-fetch-interval", "60s"],
    )
    .await;
    let started = Instant::now();
    agent
        .until(&fake, "12 tasks finished", T, |s| s.finished.len() == 12)
        .await;
    let elapsed = started.elapsed();
    fake.with(|s| {
        assert!(
            s.max_in_flight >= 3,
            "slots must be used: {}",
            s.max_in_flight
        );
        for i in 0..12 {
            let states = &s.states[&format!("t{i}")];
            assert_eq!(states, &vec!["running".to_string(), "success".to_string()]);
            let log = &s.logs[&format!("t{i}")];
            assert!(
                log.contains("task started on agent-under-test"),
                "log of t{i}: {log:?}"
            );
            assert!(log.contains("task done"));
        }
        assert!(
            s.fetch_free.iter().all(|&f| (1..=3).contains(&f)),
            "{:?}",
            s.fetch_free
        );
        // Each freed slot was refilled well before the 60 s idle interval.
        let mut gaps = Vec::new();
        for (i, (_, handed)) in s.handed_out.iter().enumerate().skip(3) {
            let (_, ended) = s.finished[i - 3];
            gaps.push(handed.saturating_duration_since(ended));
        }
        let worst = gaps.iter().max().unwrap();
        assert!(*worst < Duration::from_secs(2), "refill gaps {gaps:?}");
    });
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
    assert_eq!(
        max_task_processes(dir.path()),
        3,
        "task processes at once: slots must be used and never exceeded"
    );
    let (status, metrics) = agent.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("astro_agent_tasks_finished_total{result=\"success\"} 12"),
        "{metrics}"
    );
    assert!(metrics.contains("astro_agent_slots 3"));
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
}

#[tokio::test]
async fn a_busy_worker_heartbeats_when_its_state_changes_not_per_job() {
    let fake = FakeAirflow::start().await;
    for i in 0..12 {
        fake.add_job(&format!("h{i}"), 0.3, 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(
        &fake,
        dir.path(),
        &["--sync-slots", "3", "--heartbeat-interval", "60s"],
    )
    .await;
    agent
        .until(&fake, "12 tasks finished, then idle reported", T, |s| {
            s.finished.len() == 12 && s.heartbeats.last().map(String::as_str) == Some("idle")
        })
        .await;
    fake.with(|s| {
        // idle (the first beat), running (the first job), idle (the last one done) - not a
        // beat for every job that starts or ends (24 here).
        assert!(
            s.heartbeats.iter().any(|h| h == "running"),
            "{:?}",
            s.heartbeats
        );
        assert!(s.heartbeats.len() <= 5, "{:?}", s.heartbeats);
    });
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
}

#[tokio::test]
async fn sigterm_drains_running_tasks_and_exits_zero() {
    let fake = FakeAirflow::start().await;
    for i in 0..4 {
        fake.add_job(&format!("d{i}"), 2.0, 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &["--sync-slots", "2"]).await;
    agent
        .until(&fake, "two tasks running", T, |s| {
            s.states
                .values()
                .filter(|v| v.first().map(String::as_str) == Some("running"))
                .count()
                == 2
        })
        .await;
    assert_eq!(agent.get("/readyz").await.0, 200);
    agent.signal(Signal::SIGTERM);
    agent
        .until(&fake, "a terminating heartbeat", T, |s| {
            s.heartbeats.iter().any(|h| h == "terminating")
        })
        .await;
    let fetches_at_drain = fake.with(|s| s.fetches);
    assert_eq!(
        agent.get("/readyz").await.0,
        503,
        "not ready while draining"
    );
    assert_eq!(agent.exit_code(T).await, 0, "log:\n{}", agent.log());
    fake.with(|s| {
        for i in 0..2 {
            assert_eq!(final_state(&s.states[&format!("d{i}")]), Some("success"));
        }
        assert_eq!(s.queue.len(), 2, "no new job taken during the drain");
        assert_eq!(
            s.fetches, fetches_at_drain,
            "no fetch after the drain began"
        );
        assert_eq!(s.heartbeats.last().map(String::as_str), Some("offline"));
    });
}

#[tokio::test]
async fn a_second_signal_stops_tasks_and_reports_them_failed() {
    let fake = FakeAirflow::start().await;
    fake.add_job("long", 120.0, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &["--sync-slots", "1"]).await;
    // The task's first log line has been shipped: it runs and has its SIGTERM trap set.
    agent
        .until(&fake, "task log shipped", T, |s| {
            s.logs
                .get("long")
                .is_some_and(|l| l.contains("task started"))
        })
        .await;
    agent.signal(Signal::SIGTERM);
    agent
        .until(&fake, "a terminating heartbeat", T, |s| {
            s.heartbeats.iter().any(|h| h == "terminating")
        })
        .await;
    agent.signal(Signal::SIGINT);
    assert_eq!(agent.exit_code(T).await, 0, "log:\n{}", agent.log());
    fake.with(|s| {
        assert_eq!(final_state(&s.states["long"]), Some("failed"));
        let log = &s.logs["long"];
        assert!(log.contains("task got SIGTERM"), "{log}");
        assert!(log.contains("was stopped by the agent"), "{log}");
        assert_eq!(s.heartbeats.last().map(String::as_str), Some("offline"));
    });
}

#[tokio::test]
async fn the_drain_deadline_stops_tasks() {
    let fake = FakeAirflow::start().await;
    fake.add_job("slow", 120.0, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &["--drain-timeout", "1s"]).await;
    agent
        .until(&fake, "task running", T, |s| s.states.contains_key("slow"))
        .await;
    let signalled = Instant::now();
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
    assert!(signalled.elapsed() >= Duration::from_secs(1));
    fake.with(|s| assert_eq!(final_state(&s.states["slow"]), Some("failed")));
}

#[tokio::test]
async fn server_faults_are_retried_and_no_report_is_lost() {
    let fake = FakeAirflow::start().await;
    fake.with(|s| {
        s.register_conflicts = 2;
        s.fail_fetches = 2;
        s.malformed_fetches = 1;
        s.fail_states = 3;
    });
    fake.add_job("f1", 0.2, 0);
    fake.add_job("f2", 0.2, 3);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &[]).await;
    agent
        .until(&fake, "both tasks reported", Duration::from_secs(40), |s| {
            s.finished.len() == 2
        })
        .await;
    fake.with(|s| {
        assert_eq!(s.registers, 3, "two 409s, then accepted");
        assert_eq!(final_state(&s.states["f1"]), Some("success"));
        assert_eq!(
            final_state(&s.states["f2"]),
            Some("failed"),
            "exit code 3 is a failure"
        );
        assert_eq!(s.auth_failures, 0);
    });
    assert!(
        agent.log().contains("is still marked active"),
        "{}",
        agent.log()
    );
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
}

#[tokio::test]
async fn a_task_that_cannot_start_is_failed_with_the_reason_in_its_log() {
    let fake = FakeAirflow::start().await;
    fake.add_job("nopython", 0.1, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &["--python", "/nonexistent/python3"]).await;
    agent
        .until(&fake, "task reported", T, |s| s.finished.len() == 1)
        .await;
    fake.with(|s| {
        assert_eq!(s.states["nopython"], vec!["failed".to_string()]);
        assert!(
            s.logs["nopython"].contains("could not start the task process"),
            "{:?}",
            s.logs
        );
    });
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
}

#[tokio::test]
async fn a_job_of_a_workload_type_the_agent_does_not_run_is_failed_and_the_next_one_runs() {
    let fake = FakeAirflow::start().await;
    fake.add_job_with_command(
        "newkind",
        serde_json::json!({"type": "SomethingNew", "token": "tok",
                           "log_path": "dag_id=dag/newkind.log"}),
    );
    fake.add_job("next", 0.1, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &[]).await;
    agent
        .until(&fake, "both jobs reported", T, |s| s.finished.len() == 2)
        .await;
    fake.with(|s| {
        assert_eq!(s.states["newkind"], vec!["failed".to_string()]);
        assert!(
            s.logs["newkind"].contains("\"SomethingNew\" is not one this worker runs"),
            "{:?}",
            s.logs
        );
        assert_eq!(final_state(&s.states["next"]), Some("success"));
    });
    // No process was started for it: only the next job's task ran.
    assert_eq!(max_task_processes(dir.path()), 1);
    assert!(agent.log().contains("SomethingNew"), "{}", agent.log());
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
}

#[tokio::test]
async fn a_callback_runs_and_its_refused_log_is_kept_without_retries_or_failing_it() {
    let fake = FakeAirflow::start().await;
    fake.with(|s| s.refuse_log_pushes = true);
    // Longer than the running log push interval (5 s): a task's log would be pushed meanwhile.
    fake.add_job_with_command(
        "callback",
        serde_json::json!({"type": "ExecuteCallback", "token": "tok",
                           "log_path": "executor_callbacks/dag/run/callback",
                           "fake": {"sleep": 5.5, "exit": 0}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &[]).await;
    agent
        .until(&fake, "the callback reported", T, |s| s.finished.len() == 1)
        .await;
    fake.with(|s| {
        assert_eq!(
            s.states["callback"],
            vec!["running".to_string(), "success".to_string()]
        );
        assert_eq!(s.log_pushes, 1, "offered once, at its end");
    });
    assert!(
        agent.log().contains(
            "keeps no log for executor callbacks: the callback's log stays on this worker"
        ),
        "{}",
        agent.log()
    );
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
}

#[tokio::test]
async fn a_shutdown_request_from_airflow_drains() {
    let fake = FakeAirflow::start().await;
    fake.add_job("s1", 1.0, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &[]).await;
    agent
        .until(&fake, "task running", T, |s| s.states.contains_key("s1"))
        .await;
    fake.with(|s| s.heartbeat_answer_state = Some("shutdown request".into()));
    assert_eq!(agent.exit_code(T).await, 0);
    fake.with(|s| {
        assert_eq!(final_state(&s.states["s1"]), Some("success"));
        assert_eq!(s.heartbeats.last().map(String::as_str), Some("offline"));
    });
}

#[tokio::test]
async fn a_worker_deleted_in_airflow_registers_again() {
    let fake = FakeAirflow::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&fake, dir.path(), &[]).await;
    agent
        .until(&fake, "registered and beating", T, |s| {
            !s.heartbeats.is_empty()
        })
        .await;
    fake.with(|s| s.forget_worker = 1);
    agent
        .until(&fake, "a second registration", T, |s| s.registers == 2)
        .await;
    fake.add_job("after", 0.1, 0);
    agent
        .until(&fake, "the next job runs", T, |s| s.finished.len() == 1)
        .await;
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.exit_code(T).await, 0);
}

#[test]
fn invalid_configuration_exits_2_with_one_line_naming_the_flag() {
    let bin = env!("CARGO_BIN_EXE_astro-agent");
    let cases: &[(&[&str], &str)] = &[
        (&["--sync-slots", "0"], "--sync-slots"),
        (&["--sync-slots", "many"], "--sync-slots"),
        (&["--api-url", "not a url"], "--api-url"),
        (&["--heartbeat-interval", "soon"], "--heartbeat-interval"),
    ];
    for (args, flag) in cases {
        let out = std::process::Command::new(bin)
            .args(["--api-url", "http://127.0.0.1:1/edge_worker/v1"])
            .args(["--execution-api-url", "http://127.0.0.1:1/execution/"])
            .args(*args)
            .env("ASTRO_AGENT_JWT_SECRET", "x")
            .env_remove("ASTRO_AGENT_API_URL")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    // Environment variables are read like flags.
    let out = std::process::Command::new(bin)
        .env("ASTRO_AGENT_API_URL", "http://127.0.0.1:1/edge_worker/v1")
        .env(
            "ASTRO_AGENT_EXECUTION_API_URL",
            "http://127.0.0.1:1/execution/",
        )
        .env("ASTRO_AGENT_JWT_SECRET", "x")
        .env("ASTRO_AGENT_SYNC_SLOTS", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sync-slots"));
}

#[tokio::test]
async fn json_logs_are_one_object_per_line_and_text_logs_have_no_colour_in_a_file() {
    for format in ["json", "text"] {
        let fake = FakeAirflow::start().await;
        fake.add_job("logged", 0.0, 0);
        let dir = tempfile::tempdir().unwrap();
        let agent = start_agent(&fake, dir.path(), &["--log-format", format]).await;
        agent
            .until(&fake, "the task done", T, |s| {
                final_state(s.states.get("logged").map(Vec::as_slice).unwrap_or(&[])).is_some()
            })
            .await;
        let log = agent.log();
        assert!(log.lines().count() >= 3, "{log}");
        assert!(!log.contains('\u{1b}'), "escape codes in a file:\n{log}");
        if format == "json" {
            for line in log.lines() {
                let object: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert!(object["level"].is_string(), "{line}");
                assert!(object["message"].is_string(), "{line}");
            }
            assert!(log.contains(r#""message":"task started""#), "{log}");
        }
    }
}
