//! The Sentinel's secrets (the Airflow token or password, the Postgres URL's password, the
//! static tokens KEDA presents, and any token a caller sends) never reach its log, in either
//! format: not while it runs at debug level with failing sources, and not in a
//! configuration error.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use test_kit::fake_rest_api::fake_airflow;
use test_kit::keda::keda_get;
use test_kit::{ChildGuard, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_astro-sentinel");
const AIRFLOW_TOKEN: &str = "airflow-token-SECRET-1";
const AIRFLOW_PASSWORD: &str = "airflow-password-SECRET-2";
const PG_PASSWORD: &str = "pg-password-SECRET-3";
const STATIC_TOKEN: &str = "static-token-SECRET-4";
const CALLERS_TOKEN: &str = "callers-token-SECRET-5";

fn assert_no_secret(log: &str, context: &str) {
    assert!(
        !log.contains("SECRET"),
        "{context}: a secret reached the log:\n{log}"
    );
}

/// The binary with a clean environment: nothing from the caller's shell leaks in.
fn sentinel(config: &std::path::Path, format: &str) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .env_clear()
        .env("ASTRO_SENTINEL_LOG_FORMAT", format)
        .env("RUST_LOG", "debug");
    c
}

#[test]
fn configuration_errors_never_quote_a_secret() {
    let dir = TempDir::new("secret-config");
    let airflow = dir.file(
        "airflow.yaml",
        "source: {type: airflow-api, airflowApi: {url: \"http://127.0.0.1:9\"}}\nauth: {disabled: true}\n",
    );
    let typo = dir.file(
        "typo.yaml",
        "source: {type: airflow-api, airflowApi: {url: \"http://127.0.0.1:9\"}}\nauth: {disabled: true}\nrefreshIntervall: 2s\n",
    );
    let postgres = dir.file(
        "pg.yaml",
        "source: {type: postgres, postgres: {sslMode: disable}}\nauth: {disabled: true}\n",
    );
    let missing_tokens = dir.file(
        "tokens.yaml",
        "source: {type: postgres, postgres: {sslMode: disable}}\nauth: {staticTokensFile: /nonexistent/tokens}\n",
    );
    let good_pg = format!("postgres://u:{PG_PASSWORD}@127.0.0.1:9/db");
    let cases: Vec<(&std::path::Path, Vec<(&str, String)>)> = vec![
        (
            typo.as_path(),
            vec![("ASTRO_SENTINEL_AIRFLOW_TOKEN", AIRFLOW_TOKEN.into())],
        ),
        (
            airflow.as_path(),
            vec![
                ("ASTRO_SENTINEL_AIRFLOW_TOKEN", AIRFLOW_TOKEN.into()),
                ("ASTRO_SENTINEL_AIRFLOW_USERNAME", "admin".into()),
                ("ASTRO_SENTINEL_AIRFLOW_PASSWORD", AIRFLOW_PASSWORD.into()),
            ],
        ),
        (
            airflow.as_path(),
            vec![("ASTRO_SENTINEL_AIRFLOW_PASSWORD", AIRFLOW_PASSWORD.into())],
        ),
        (
            missing_tokens.as_path(),
            vec![("ASTRO_SENTINEL_POSTGRES_URL", good_pg)],
        ),
    ]
    .into_iter()
    .chain(
        // URLs the Postgres driver refuses, the password in each.
        [
            format!("postgres://u:{PG_PASSWORD}@host:notaport/db"),
            format!("postgres://u:{PG_PASSWORD}@host/db?sslmode=sometimes"),
            format!("postgres://u:{PG_PASSWORD}@host/db?unknown={PG_PASSWORD}"),
            format!("postgres://u:{PG_PASSWORD}@[::1/db"),
            format!("host=h password={PG_PASSWORD} port=x"),
            format!("host=h password='{PG_PASSWORD}"),
        ]
        .into_iter()
        .map(|url| {
            (
                postgres.as_path(),
                vec![("ASTRO_SENTINEL_POSTGRES_URL", url)],
            )
        }),
    )
    .collect();
    for format in ["text", "json"] {
        for (config, env) in &cases {
            let out = sentinel(config, format)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let context = format!("{format} {} {env:?}", config.display());
            assert_eq!(out.status.code(), Some(2), "{context}: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "{context}: {stderr}");
            assert_no_secret(&stderr, &context);
        }
    }
}

/// Starts the binary with its log in `log`; waits for its address.
fn start(mut cmd: Command, log: &std::path::Path) -> (ChildGuard, std::net::SocketAddr) {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let child = ChildGuard(child);
    let text = wait_for_log(log, "listening");
    // `addr=127.0.0.1:N` in text, `"addr":"127.0.0.1:N"` in JSON.
    let at = text.find("addr").unwrap() + "addr".len();
    let addr: String = text[at..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    (child, addr.parse().unwrap())
}

/// The log once it contains `needle`.
fn wait_for_log(log: &std::path::Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(mut child: ChildGuard) {
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            return;
        }
        assert!(Instant::now() < deadline, "did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_sentinel_never_logs_its_secrets() {
    let (_fake, upstream) = fake_airflow().await;
    // A port nothing listens on: the Postgres source fails to connect on every refresh.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempDir::new("secret-run");
    let tokens = dir.file("tokens", &format!("{STATIC_TOKEN}\n"));
    let workers = "refreshInterval: 100ms\nworkers:\n  - {name: w, queues: [a]}\n";
    let airflow = dir.file(
        "airflow.yaml",
        &format!(
            "source: {{type: airflow-api, airflowApi: {{url: \"http://{}\"}}}}\nauth: {{staticTokensFile: {}}}\n{workers}",
            upstream.addr,
            tokens.display()
        ),
    );
    let postgres = dir.file(
        "pg.yaml",
        &format!(
            "source: {{type: postgres, postgres: {{sslMode: disable}}}}\nauth: {{staticTokensFile: {}}}\n{workers}",
            tokens.display()
        ),
    );
    for format in ["text", "json"] {
        let mut with_password = sentinel(&airflow, format);
        with_password
            .env("ASTRO_SENTINEL_AIRFLOW_USERNAME", "admin")
            .env("ASTRO_SENTINEL_AIRFLOW_PASSWORD", AIRFLOW_PASSWORD);
        let mut with_token = sentinel(&airflow, format);
        with_token.env("ASTRO_SENTINEL_AIRFLOW_TOKEN", AIRFLOW_TOKEN);
        let mut with_postgres = sentinel(&postgres, format);
        with_postgres.env(
            "ASTRO_SENTINEL_POSTGRES_URL",
            format!("postgres://astro:{PG_PASSWORD}@127.0.0.1:{closed_port}/airflow"),
        );
        for (name, cmd) in [
            ("password", with_password),
            ("token", with_token),
            ("postgres", with_postgres),
        ] {
            let log = dir.0.join(format!("{name}-{format}.log"));
            let (child, addr) = start(cmd, &log);
            // KEDA's token and a caller's wrong one.
            let answer = keda_get(addr, "/v1/workers/w", Some(STATIC_TOKEN)).await;
            assert!([200, 503].contains(&answer.status), "{}", answer.status);
            let answer = keda_get(addr, "/v1/workers/w", Some(CALLERS_TOKEN)).await;
            assert_eq!(answer.status, 401);
            // The source's failure is logged: the login (no /auth/token on the fake), the token
            // (the fake expects another) or the connection (nothing listens).
            wait_for_log(&log, "queue refresh failed");
            stop(child);
            let text = std::fs::read_to_string(&log).unwrap();
            assert!(text.contains("stopping"), "{text}");
            assert_no_secret(&text, &format!("{name} {format}"));
        }
    }
}
