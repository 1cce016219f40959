//! The agent's secrets (Airflow's JWT secret, the REST API password or token, each task's
//! Execution API token) never reach its log, in either format: not while it runs at debug
//! level through a job and failing REST calls, and not in a configuration error.

use nix::sys::signal::Signal;
use std::time::Duration;
use test_kit::agent_process::start_agent_with_env;
use test_kit::fake_edge_api::{FakeAirflow, SECRET};

const T: Duration = Duration::from_secs(20);
const REST_PASSWORD: &str = "rest-password-SECRET-7";
const REST_TOKEN: &str = "rest-token-SECRET-8";
/// The token inside every job the fake hands out (see `FakeAirflow::add_job`).
const TASK_TOKEN: &str = "task-token";

fn assert_no_secret(log: &str, context: &str) {
    for secret in [SECRET, REST_PASSWORD, REST_TOKEN, TASK_TOKEN] {
        assert!(
            !log.contains(secret),
            "{context}: {secret:?} reached the log:\n{log}"
        );
    }
}

#[tokio::test]
async fn a_running_agent_never_logs_its_secrets() {
    for format in ["text", "json"] {
        let fake = FakeAirflow::start().await;
        fake.add_job("secretive", 0.1, 0);
        let dir = tempfile::tempdir().unwrap();
        let secret_file = dir.path().join("jwt-secret");
        std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
        let rest_url = format!("http://{}", fake.addr);
        let mut agent = start_agent_with_env(
            &fake,
            dir.path(),
            &[
                "--log-format",
                format,
                "--jwt-secret-file",
                secret_file.to_str().unwrap(),
                // The fake refuses the REST login (403): the error path is logged too.
                "--rest-api-url",
                &rest_url,
                "--rest-api-username",
                "admin",
            ],
            &[
                ("ASTRO_AGENT_REST_API_PASSWORD", REST_PASSWORD),
                ("RUST_LOG", "debug"),
            ],
        )
        .await;
        agent
            .until(&fake, "the job done and the REST login refused", T, |s| {
                s.finished.len() == 1 && s.auth_failures >= 1
            })
            .await;
        agent
            .until(&fake, "the refusal logged", T, |_| {
                agent.log().contains("queue stats refresh failed")
            })
            .await;
        agent.signal(Signal::SIGTERM);
        assert_eq!(agent.exit_code(T).await, 0);
        let log = agent.log();
        assert!(log.contains("secretive"), "the job is in the log:\n{log}");
        assert_no_secret(&log, format);
    }
}

#[test]
fn configuration_errors_never_quote_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let missing = missing.to_str().unwrap();
    let password_flag = format!("--rest-api-password={REST_PASSWORD}");
    let cases: &[&[&str]] = &[
        &["--sync-slots", "0"],
        &[
            "--rest-api-url",
            "http://127.0.0.1:1",
            "--rest-api-token",
            REST_TOKEN,
            "--rest-api-username",
            "admin",
            "--rest-api-password",
            REST_PASSWORD,
        ],
        // The token from the environment and a username: not both.
        &[
            "--rest-api-url",
            "http://127.0.0.1:1",
            "--rest-api-username",
            "admin",
        ],
        &["--jwt-secret-file", missing],
        // A misspelt or repeated flag: the parser names the flag, not the value.
        &[&format!("--rest-api-pasword={REST_PASSWORD}")],
        &[&format!("--jwt-secret={SECRET}")],
        &[&password_flag, &password_flag],
    ];
    for format in ["text", "json"] {
        for args in cases {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_astro-agent"))
                .args(["--api-url", "http://127.0.0.1:1/edge_worker/v1"])
                .args(["--execution-api-url", "http://127.0.0.1:1/execution/"])
                .args([
                    "--airflow-version",
                    "3.3.2",
                    "--edge-provider-version",
                    "5.1.0",
                ])
                .args(["--log-format", format])
                .args(*args)
                .env_clear()
                .env("ASTRO_AGENT_JWT_SECRET", SECRET)
                .env("ASTRO_AGENT_REST_API_TOKEN", REST_TOKEN)
                .env("RUST_LOG", "debug")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let context = format!("{format} {args:?}");
            assert_eq!(out.status.code(), Some(2), "{context}: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "{context}: {stderr}");
            assert_no_secret(&stderr, &context);
        }
    }
}
