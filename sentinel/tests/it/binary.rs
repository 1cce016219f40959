//! The `astro-sentinel` binary as a process: configuration errors exit 2 with one line naming
//! the worker and field; SIGTERM/SIGINT stop it cleanly (exit 0); a port in use is a runtime
//! error (exit 1); and tokens never appear in its logs, even at debug level.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use test_kit::fake_kubernetes::FakeKubernetes;
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::{keda_get, value_at};
use test_kit::{eventually, ChildGuard, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_astro-sentinel");

fn sentinel(config: &std::path::Path) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--config").arg(config);
    // A clean environment: nothing from the caller's shell leaks in.
    for (k, _) in std::env::vars() {
        if k.starts_with("ASTRO_SENTINEL_") || k.starts_with("KUBERNETES_") {
            c.env_remove(k);
        }
    }
    c
}

/// Runs the binary to completion; returns (exit code, stderr).
fn run(cmd: &mut Command) -> (i32, String) {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const HEAD: &str = "source: {type: airflow-api, airflowApi: {url: \"http://127.0.0.1:9\"}}\nauth: {disabled: true}\n";

#[test]
fn configuration_errors_exit_2_with_one_line_naming_worker_and_field() {
    let dir = TempDir::new("bin-config");
    let cases: &[(&str, &[&str])] = &[
        (
            "workers:\n  - {name: w1, queues: [a], queus: [b]}\n",
            &["w1", "queus"],
        ),
        (
            "workers:\n  - {name: w2, queues: [a]}\n  - {name: w2, queues: [b]}\n",
            &["w2", "name", "duplicate"],
        ),
        ("workers:\n  - {name: w3, queues: []}\n", &["w3", "queues"]),
        ("workers:\n  - {name: w4}\n", &["w4", "queues"]),
        (
            "workers:\n  - {name: w5, queues: [a], syncSlots: 0}\n",
            &["w5", "syncSlots"],
        ),
        (
            "workers:\n  - {name: w6, queues: [a], minReplicas: 5, maxReplicas: 2}\n",
            &["w6", "minReplicas"],
        ),
        (
            "workers:\n  - {name: w7, queues: [a], maxReplicas: -1}\n",
            &["w7", "maxReplicas"],
        ),
        (
            "refreshInterval: 2s\nrefreshIntervall: 3s\n",
            &["refreshIntervall"],
        ),
        ("stalenessLimit: 1s\n", &["stalenessLimit"]),
    ];
    for (i, (yaml, needles)) in cases.iter().enumerate() {
        let path = dir.file(&format!("c{i}.yaml"), &format!("{HEAD}{yaml}"));
        let (code, stderr) = run(sentinel(&path).env("ASTRO_SENTINEL_AIRFLOW_TOKEN", "x"));
        assert_eq!(code, 2, "case {i}: {stderr}");
        assert_eq!(
            stderr.lines().count(),
            1,
            "case {i}: not one line: {stderr:?}"
        );
        for needle in *needles {
            assert!(
                stderr.contains(needle),
                "case {i}: {needle:?} not in {stderr:?}"
            );
        }
    }
}

#[test]
fn missing_flags_and_secrets_exit_2() {
    let dir = TempDir::new("bin-flags");
    let (code, stderr) = run(&mut Command::new(BIN));
    assert_eq!(code, 2);
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    assert!(stderr.contains("--config"), "{stderr}");

    let ok = dir.file(
        "ok.yaml",
        &format!("{HEAD}workers:\n  - {{name: w, queues: [a]}}\n"),
    );
    let (code, stderr) = run(&mut sentinel(&ok));
    assert_eq!(code, 2);
    assert!(stderr.contains("ASTRO_SENTINEL_AIRFLOW_TOKEN"), "{stderr}");
    let (code, stderr) = run(sentinel(&ok).env("ASTRO_SENTINEL_AIRFLOW_USERNAME", "admin"));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("ASTRO_SENTINEL_AIRFLOW_PASSWORD"),
        "{stderr}"
    );
    let (code, stderr) = run(sentinel(&ok)
        .env("ASTRO_SENTINEL_AIRFLOW_TOKEN", "x")
        .args(["--listen", "nowhere"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("--listen"), "{stderr}");

    let pg = dir.file(
        "pg.yaml",
        "source: {type: postgres, postgres: {sslMode: disable}}\nauth: {disabled: true}\n",
    );
    let (code, stderr) = run(&mut sentinel(&pg));
    assert_eq!(code, 2);
    assert!(stderr.contains("ASTRO_SENTINEL_POSTGRES_URL"), "{stderr}");

    // Certificates are checked by default, so a CA must be named.
    let unchecked = dir.file(
        "pg-default.yaml",
        "source: {type: postgres}\nauth: {disabled: true}\n",
    );
    let (code, stderr) = run(sentinel(&unchecked).env(
        "ASTRO_SENTINEL_POSTGRES_URL",
        "postgres://u:p@127.0.0.1:9/db",
    ));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("source.postgres.caFile") && stderr.contains("verify-full"),
        "{stderr}"
    );
    // A URL that weakens the file's sslMode is refused, not silently overridden.
    let (code, stderr) = run(sentinel(&pg).env(
        "ASTRO_SENTINEL_POSTGRES_URL",
        "postgres://u:p@127.0.0.1:9/db?sslmode=require",
    ));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("sslmode=require conflicts with source.postgres.sslMode disable"),
        "{stderr}"
    );
    assert!(!stderr.contains(":p@"), "the password leaked: {stderr}");

    let tr = dir.file(
        "tr.yaml",
        "source: {type: postgres, postgres: {sslMode: disable}}\nauth: {tokenReview: {allowedUsernames: [a]}}\n",
    );
    let (code, stderr) = run(sentinel(&tr).env(
        "ASTRO_SENTINEL_POSTGRES_URL",
        "postgres://u:p@127.0.0.1:9/db",
    ));
    assert_eq!(code, 2);
    assert!(stderr.contains("--kubernetes-api-url"), "{stderr}");

    let tokens_missing = dir.file(
        "st.yaml",
        "source: {type: postgres, postgres: {sslMode: disable}}\nauth: {staticTokensFile: /nonexistent/tokens}\n",
    );
    let (code, stderr) = run(sentinel(&tokens_missing)
        .env(
            "ASTRO_SENTINEL_POSTGRES_URL",
            "postgres://u:p@127.0.0.1:9/db",
        )
        .args(["--listen", "127.0.0.1:0"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("auth.staticTokensFile"), "{stderr}");
    assert!(!stderr.contains(":p@"), "the password leaked: {stderr}");
}

/// A child process that is killed and reaped when dropped (e.g. when an assertion fails).
type Lines = std::sync::mpsc::Receiver<String>;

/// Starts the binary, waits for its "listening" log line, returns the child and its address.
fn spawn_listening(cmd: &mut Command) -> (ChildGuard, std::net::SocketAddr, Lines) {
    let child = cmd
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .unwrap_or_else(|_| panic!("no 'listening' line; got {seen:#?}"));
        if line.contains("listening") {
            let addr = line
                .split("addr=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            return (child, addr.parse().unwrap(), rx);
        }
        seen.push(line);
    }
}

fn signal(child: &ChildGuard, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.0.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

fn wait_exit(child: &mut ChildGuard) -> i32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(std::time::Instant::now() < deadline, "did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// JWT-shaped, as only such tokens are sent for review.
const BOUND_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.bound-token-SECRET-4";
const WRONG_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ3In0.wrong-token-SECRET-2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_stop_cleanly_and_tokens_never_reach_the_logs() {
    let (fake, upstream) = fake_airflow().await;
    fake.set("a", 5, 1);
    let fake_kube = FakeKubernetes::new("own-sa-token-SECRET-3");
    fake_kube
        .users
        .lock()
        .unwrap()
        .insert(BOUND_TOKEN.into(), "system:serviceaccount:x:y".into());
    let kube = fake_kube.start().await;
    let dir = TempDir::new("bin-run");
    let tokens = dir.file("tokens", "static-token-SECRET-1\n");
    let own = dir.file("own-token", "own-sa-token-SECRET-3");
    let config = dir.file(
        "c.yaml",
        &format!(
            "refreshInterval: 100ms
source: {{type: airflow-api, airflowApi: {{url: \"http://{}\"}}}}
auth:
  staticTokensFile: {}
  tokenReview: {{allowedUsernames: [\"system:serviceaccount:keda:k\"]}}
workers:
  - {{name: w, queues: [a], syncSlots: 2}}
",
            upstream.addr,
            tokens.display()
        ),
    );

    for sig in ["TERM", "INT"] {
        let (mut child, addr, lines) = spawn_listening(
            sentinel(&config)
                .env("ASTRO_SENTINEL_AIRFLOW_TOKEN", "airflow-token")
                .args(["--listen", "127.0.0.1:0"])
                .args(["--kubernetes-api-url", &format!("http://{}", kube.addr)])
                .arg("--kubernetes-token-file")
                .arg(&own),
        );
        let ok = eventually(Duration::from_secs(5), "200", || async {
            let a = keda_get(addr, "/v1/workers/w", Some("static-token-SECRET-1")).await;
            (a.status == 200).then_some(a)
        })
        .await;
        assert_eq!(value_at(&ok, "desiredReplicas"), 3.0);
        assert_eq!(
            keda_get(addr, "/v1/workers/w", Some(WRONG_TOKEN))
                .await
                .status,
            401
        );
        assert_eq!(
            keda_get(addr, "/v1/workers/w", Some(BOUND_TOKEN))
                .await
                .status,
            403
        );
        signal(&child, sig);
        assert_eq!(wait_exit(&mut child), 0, "SIG{sig} is a clean stop");
        let log: Vec<String> = lines.try_iter().collect();
        let log = log.join("\n");
        assert!(log.contains("stopping"), "{log}");
        assert!(!log.contains("SECRET"), "a token reached the log:\n{log}");
        assert!(
            !log.contains("airflow-token"),
            "the Airflow token reached the log:\n{log}"
        );
    }
}

#[test]
fn a_port_in_use_is_a_runtime_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = TempDir::new("bin-port");
    let config = dir.file(
        "c.yaml",
        &format!("{HEAD}workers:\n  - {{name: w, queues: [a]}}\n"),
    );
    let (code, stderr) = run(sentinel(&config)
        .env("ASTRO_SENTINEL_AIRFLOW_TOKEN", "x")
        .args(["--listen", &taken.local_addr().unwrap().to_string()]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");
}

#[test]
fn json_logs_are_one_object_per_line_and_text_logs_have_no_colour_in_a_pipe() {
    let dir = TempDir::new("bin-logs");
    let config = dir.file("c.yaml", HEAD);
    for format in ["json", "text"] {
        let child = sentinel(&config)
            .args(["--listen", "127.0.0.1:0"])
            .env("ASTRO_SENTINEL_LOG_FORMAT", format)
            .env("ASTRO_SENTINEL_AIRFLOW_TOKEN", "t")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = ChildGuard(child);
        let stderr = BufReader::new(child.0.stderr.take().unwrap());
        let mut lines = Vec::new();
        for line in stderr.lines().map_while(Result::ok) {
            let listening = line.contains("listening");
            lines.push(line);
            if listening {
                break;
            }
        }
        assert!(lines.last().unwrap().contains("listening"), "{lines:#?}");
        for line in &lines {
            assert!(
                !line.contains('\u{1b}'),
                "an escape code in a pipe: {line:?}"
            );
            if format == "json" {
                let object: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert!(
                    object["level"].is_string() && object["message"].is_string(),
                    "{line}"
                );
            }
        }
    }
}
