//! The agent's configuration: one clap struct, every flag also read from `ASTRO_AGENT_<FLAG>`,
//! and one validation step that turns it into [`Config`] or a one-line error naming the flag.

use crate::admin_server::AdminConnections;
use crate::stop_budget::StopBudget;
use crate::task_env::EnvPattern;
use crate::task_host_socket::TaskHostSocket;
use airflow::rest_api::{CredentialNames, RestCredentials};
use airflow::secret_file::{value_or_file, SecretError};
use clap::{ArgGroup, Parser};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use url::Url;

#[derive(Debug, Parser)]
#[command(
    name = "astro-agent",
    version,
    about = "Runs Apache Airflow 3 tasks from the Edge Worker API; drains on SIGTERM.",
    // The REST API takes a token or a username and password, never a mix.
    group = ArgGroup::new("rest_api_token_given")
        .args(["rest_api_token", "rest_api_token_file"])
        .multiple(true)
        .conflicts_with_all(["rest_api_username", "rest_api_password_given"]),
    group = ArgGroup::new("rest_api_password_given")
        .args(["rest_api_password", "rest_api_password_file"])
        .multiple(true)
        .requires("rest_api_username"),
)]
pub struct Flags {
    /// Edge Worker API base URL, e.g. http://airflow-api-server:8080/edge_worker/v1
    #[arg(long, env = "ASTRO_AGENT_API_URL", value_name = "URL")]
    pub api_url: Option<String>,

    // An attribute, not a doc comment: rustdoc would take "[api_auth]" for a link.
    #[arg(
        long,
        env = "ASTRO_AGENT_JWT_SECRET_FILE",
        value_name = "PATH",
        help = "File holding Airflow's [api_auth] jwt_secret (or give the value in ASTRO_AGENT_JWT_SECRET; \
                there is no flag for the value, as command lines are readable by every process)"
    )]
    pub jwt_secret_file: Option<PathBuf>,

    /// Name this worker registers under [default: $HOSTNAME, else the host name]
    #[arg(long, env = "ASTRO_AGENT_WORKER_NAME", value_name = "NAME")]
    pub worker_name: Option<String>,

    /// Comma-separated queues to take tasks from
    #[arg(
        long,
        env = "ASTRO_AGENT_QUEUES",
        value_name = "QUEUES",
        default_value = "default",
        value_delimiter = ',',
        value_parser = queue_name
    )]
    pub queues: Vec<String>,

    /// Slots: how many task slots run at once (a job takes its concurrency_slots of them)
    #[arg(
        long,
        env = "ASTRO_AGENT_SYNC_SLOTS",
        value_name = "N",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub sync_slots: u32,

    /// Address of the HTTP server for /metrics, /healthz and /readyz
    #[arg(
        long,
        env = "ASTRO_AGENT_LISTEN",
        value_name = "ADDR",
        default_value = "0.0.0.0:39091"
    )]
    pub listen: SocketAddr,

    /// Connections the HTTP server of --listen holds at once (probes and scrapers need a few;
    /// the rest of the agent's file descriptors are for its tasks)
    #[arg(long, env = "ASTRO_AGENT_ADMIN_MAX_CONNECTIONS", value_name = "N",
          default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub admin_max_connections: u16,

    /// Of those, how many one client address may hold, so that one cannot take them all (the
    /// Pod itself, from any loopback address or its own, is one client)
    #[arg(long, env = "ASTRO_AGENT_ADMIN_MAX_CONNECTIONS_PER_PEER", value_name = "N",
          default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub admin_max_connections_per_peer: u16,

    /// Of those, how many only an address holding no connection may take (the kubelet's next
    /// probe), so that several addresses at their share cannot take them all either
    #[arg(
        long,
        env = "ASTRO_AGENT_ADMIN_RESERVED_CONNECTIONS",
        value_name = "N",
        default_value_t = 8
    )]
    pub admin_reserved_connections: u16,

    /// Time between heartbeats (and queue-stats refreshes)
    #[arg(long, env = "ASTRO_AGENT_HEARTBEAT_INTERVAL", value_name = "DURATION",
          default_value = "30s", value_parser = duration_at_least(Duration::from_secs(1)))]
    pub heartbeat_interval: Duration,

    /// Time between fetches while slots are free and the last fetch found no job
    #[arg(long, env = "ASTRO_AGENT_IDLE_FETCH_INTERVAL", value_name = "DURATION",
          default_value = "5s", value_parser = duration_at_least(Duration::from_millis(100)))]
    pub idle_fetch_interval: Duration,

    /// Execution API URL handed to tasks, e.g. http://airflow-api-server:8080/execution/
    #[arg(long, env = "ASTRO_AGENT_EXECUTION_API_URL", value_name = "URL")]
    pub execution_api_url: Option<String>,

    /// Python executable, where tasks run, that has the Airflow task SDK
    /// (in the tasks container, with --task-host-socket)
    #[arg(
        long,
        env = "ASTRO_AGENT_PYTHON",
        value_name = "PATH",
        default_value = "python3"
    )]
    pub python: PathBuf,

    /// Drive the task host listening on this abstract Unix socket name (the tasks container of
    /// a worker Pod, in the Pod's network namespace) [default: start one as a child]
    #[arg(long, env = "ASTRO_AGENT_TASK_HOST_SOCKET", value_name = "@NAME")]
    pub task_host_socket: Option<TaskHostSocket>,

    /// Airflow's base log folder: tasks write their logs below it
    #[arg(
        long,
        env = "ASTRO_AGENT_LOG_FOLDER",
        value_name = "PATH",
        default_value = "/opt/airflow/logs"
    )]
    pub log_folder: PathBuf,

    /// Airflow version to report, never replaced [default: the api-server's (GET
    /// /api/v2/version), else detected from --python]
    #[arg(long, env = "ASTRO_AGENT_AIRFLOW_VERSION", value_name = "VERSION")]
    pub airflow_version: Option<String>,

    /// Edge provider version to report, never replaced [default: the version Airflow names
    /// when it refuses another; detected from --python until then]
    #[arg(
        long,
        env = "ASTRO_AGENT_EDGE_PROVIDER_VERSION",
        value_name = "VERSION"
    )]
    pub edge_provider_version: Option<String>,

    /// How long a drain may wait for running tasks before it SIGTERMs them [default: no limit]
    #[arg(long, env = "ASTRO_AGENT_DRAIN_TIMEOUT", value_name = "DURATION",
          value_parser = humantime::parse_duration)]
    pub drain_timeout: Option<Duration>,

    /// Time kept after the drain deadline (or a second signal) to stop the tasks, send their final
    /// states and logs, report offline and exit: in a Pod, the grace period minus the drain
    /// timeout. At least 35s (10s for tasks to exit, 10s for their reports, 10s to report
    /// offline, 5s to exit); what is above that goes to the reports
    #[arg(long, env = "ASTRO_AGENT_DRAIN_MARGIN", value_name = "DURATION",
          default_value = "60s", value_parser = humantime::parse_duration)]
    pub drain_margin: Duration,

    /// Log lines for people (text; colour only on a terminal) or for log pipelines (json)
    #[arg(
        long,
        env = "ASTRO_AGENT_LOG_FORMAT",
        value_name = "FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: logging::LogFormat,

    /// How task processes start: forked from a launcher that has Airflow imported already
    /// (falls back to fresh interpreters while it is unavailable), or always fresh
    #[arg(
        long,
        env = "ASTRO_AGENT_LAUNCH_MODE",
        value_enum,
        default_value = "prefork"
    )]
    pub launch_mode: LaunchMode,

    /// Airflow REST API base (http://HOST:PORT) for queue stats; off when not given
    #[arg(long, env = "ASTRO_AGENT_REST_API_URL", value_name = "URL")]
    pub rest_api_url: Option<String>,

    /// Bearer token for the REST API (on a command line every process can read it: prefer
    /// --rest-api-token-file)
    #[arg(
        long,
        env = "ASTRO_AGENT_REST_API_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub rest_api_token: Option<String>,

    /// File holding the bearer token for the REST API
    #[arg(long, env = "ASTRO_AGENT_REST_API_TOKEN_FILE", value_name = "PATH")]
    pub rest_api_token_file: Option<PathBuf>,

    /// User exchanged for a token at /auth/token (with --rest-api-password)
    #[arg(
        long,
        env = "ASTRO_AGENT_REST_API_USERNAME",
        value_name = "USER",
        requires = "rest_api_password_given"
    )]
    pub rest_api_username: Option<String>,

    /// Password for --rest-api-username (prefer --rest-api-password-file)
    #[arg(
        long,
        env = "ASTRO_AGENT_REST_API_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    pub rest_api_password: Option<String>,

    /// File holding the password for --rest-api-username
    #[arg(long, env = "ASTRO_AGENT_REST_API_PASSWORD_FILE", value_name = "PATH")]
    pub rest_api_password_file: Option<PathBuf>,

    /// Comma-separated environment variables tasks inherit besides the built-in list (PATH,
    /// HOME, locale, PYTHON*, AIRFLOW_* but Airflow's server secrets, TLS and proxy settings);
    /// NAME* allows a prefix. The agent's own ASTRO_AGENT_* settings never pass.
    #[arg(
        long,
        env = "ASTRO_AGENT_TASK_ENV_ALLOW",
        value_name = "NAMES",
        value_delimiter = ','
    )]
    pub task_env_allow: Vec<String>,
    /// PEM file of a private CA to trust for https Edge and REST API URLs, besides the built-in roots
    #[arg(long, env = "ASTRO_AGENT_CA_FILE", value_name = "PATH")]
    pub ca_file: Option<PathBuf>,

    /// The Sentinel's base URL, e.g. http://astro-sentinel:39092: while idle, the agent holds a
    /// subscription to its queues there and fetches the moment work is queued; off when not given
    #[arg(long, env = "ASTRO_AGENT_SENTINEL_URL", value_name = "URL")]
    pub sentinel_url: Option<String>,

    /// File holding the bearer token for the Sentinel, read again at each connection
    /// (projected service-account tokens rotate)
    #[arg(long, env = "ASTRO_AGENT_SENTINEL_TOKEN_FILE", value_name = "PATH")]
    pub sentinel_token_file: Option<PathBuf>,

    /// PEM file of a private CA to trust for an https Sentinel, besides the built-in roots
    #[arg(long, env = "ASTRO_AGENT_SENTINEL_CA_FILE", value_name = "PATH")]
    pub sentinel_ca_file: Option<PathBuf>,

    /// Time between fetches while idle and subscribed to the Sentinel, which wakes the agent
    /// when work is queued (without a subscription: --idle-fetch-interval)
    // 60 s: a backstop only (the wake comes from the Sentinel), and with the 30 s heartbeat it
    // keeps an idle fleet under a quarter of the Python worker's requests.
    #[arg(long, env = "ASTRO_AGENT_SUBSCRIBED_IDLE_FETCH_INTERVAL", value_name = "DURATION",
          default_value = "60s", value_parser = duration_at_least(Duration::from_millis(100)))]
    pub subscribed_idle_fetch_interval: Duration,
}

/// A queue name from the comma-separated list, without the spaces around it.
fn queue_name(value: &str) -> Result<String, String> {
    match value.trim() {
        "" => Err("empty queue name".into()),
        name => Ok(name.to_string()),
    }
}

/// A duration no shorter than `min`: shorter intervals would only load the API server.
fn duration_at_least(
    min: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |value| {
        let duration = humantime::parse_duration(value).map_err(|e| e.to_string())?;
        if duration < min {
            return Err(format!(
                "must be at least {}",
                humantime::format_duration(min)
            ));
        }
        Ok(duration)
    }
}

/// Where queue statistics come from, when they are on.
#[derive(Debug, Clone)]
pub struct RestApiConfig {
    pub url: Url,
    pub credentials: RestCredentials,
}

/// Where idle agents subscribe to be woken, when they do.
#[derive(Debug, Clone)]
pub struct SentinelConfig {
    pub url: Url,
    /// Read at each connection; none when the Sentinel's auth is disabled.
    pub token_file: Option<PathBuf>,
    pub ca: Option<airflow::trusted_ca::TrustedCa>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub api_url: Url,
    pub jwt_secret: Secret,
    pub worker_name: String,
    pub queues: Vec<String>,
    pub sync_slots: u32,
    pub listen: SocketAddr,
    pub admin_connections: AdminConnections,
    pub heartbeat_interval: Duration,
    pub idle_fetch_interval: Duration,
    pub execution_api_url: Url,
    pub python: PathBuf,
    pub task_host_socket: Option<TaskHostSocket>,
    pub log_folder: PathBuf,
    pub airflow_version: Option<String>,
    pub edge_provider_version: Option<String>,
    pub drain_timeout: Option<Duration>,
    pub stop_budget: StopBudget,
    pub launch_mode: LaunchMode,
    pub rest_api: Option<RestApiConfig>,
    /// Environment variables tasks inherit besides the built-in allowlist.
    pub task_env_allow: Vec<EnvPattern>,
    /// Trusted for https Airflow besides the built-in roots.
    pub ca: Option<airflow::trusted_ca::TrustedCa>,
    pub sentinel: Option<SentinelConfig>,
    pub subscribed_idle_fetch_interval: Duration,
}

/// How task processes are started.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LaunchMode {
    /// Fork from a long-lived launcher that has imported Airflow already (fresh interpreters
    /// while it is not available).
    Prefork,
    /// A fresh interpreter per task.
    Fresh,
}

/// Bytes that must never be printed.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

/// A configuration error: the flag it concerns and what is wrong, printed as one line.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub flag: &'static str,
    pub problem: String,
}

impl std::error::Error for ConfigError {}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid configuration: {}: {}", self.flag, self.problem)
    }
}

fn err(flag: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        flag,
        problem: problem.into(),
    }
}

impl From<SecretError> for ConfigError {
    fn from(e: SecretError) -> Self {
        ConfigError {
            flag: e.flag,
            problem: e.problem,
        }
    }
}

fn http_url(flag: &'static str, value: Option<&str>) -> Result<Url, ConfigError> {
    let value = value.ok_or_else(|| err(flag, "is required"))?;
    let url = Url::parse(value).map_err(|e| err(flag, format!("{value:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(err(
            flag,
            format!("{value:?} must be an http:// or https:// URL with a host"),
        ));
    }
    Ok(url)
}

impl Flags {
    /// Checks every value and reads the secret. `env_secret` is ASTRO_AGENT_JWT_SECRET and
    /// `hostname` the fallback worker name; both are passed in so tests need no process state.
    pub fn validate(
        self,
        env_secret: Option<String>,
        hostname: impl FnOnce() -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let api_url = http_url("--api-url", self.api_url.as_deref())?;
        let execution_api_url = http_url("--execution-api-url", self.execution_api_url.as_deref())?;

        let jwt_secret = value_or_file(
            env_secret,
            "ASTRO_AGENT_JWT_SECRET",
            self.jwt_secret_file.as_deref(),
            "--jwt-secret-file",
        )?
        .ok_or_else(|| {
            err(
                "--jwt-secret-file",
                "is required (or set ASTRO_AGENT_JWT_SECRET)",
            )
        })?;
        // A Secret created with `echo` ends in a newline that is not part of the secret.
        let jwt_secret = jwt_secret.trim_end().as_bytes().to_vec();
        if jwt_secret.is_empty() {
            return Err(err("--jwt-secret-file", "the JWT secret is empty"));
        }

        let worker_name = match self.worker_name.or_else(hostname) {
            Some(name) if !name.trim().is_empty() => name.trim().to_string(),
            _ => {
                return Err(err(
                    "--worker-name",
                    "is required (no HOSTNAME to default to)",
                ))
            }
        };
        if worker_name.contains('/') {
            return Err(err("--worker-name", "must not contain '/'"));
        }

        let admin_connections = AdminConnections {
            max: self.admin_max_connections.into(),
            per_peer: self.admin_max_connections_per_peer.into(),
            reserved: self.admin_reserved_connections.into(),
        };
        if admin_connections.reserved >= admin_connections.max {
            return Err(err(
                "--admin-reserved-connections",
                format!(
                    "{} must be less than --admin-max-connections ({}): the reserve is a part of them",
                    admin_connections.reserved, admin_connections.max
                ),
            ));
        }
        let stop_budget =
            StopBudget::within(self.drain_margin).map_err(|e| err("--drain-margin", e))?;

        let rest_api = match self.rest_api_url.as_deref() {
            None => None,
            Some(url) => {
                let url = http_url("--rest-api-url", Some(url))?;
                let token = value_or_file(
                    self.rest_api_token,
                    "--rest-api-token",
                    self.rest_api_token_file.as_deref(),
                    "--rest-api-token-file",
                )?;
                let password = value_or_file(
                    self.rest_api_password,
                    "--rest-api-password",
                    self.rest_api_password_file.as_deref(),
                    "--rest-api-password-file",
                )?;
                let credentials = RestCredentials::from_given(
                    token,
                    self.rest_api_username,
                    password,
                    CredentialNames {
                        token: "--rest-api-token",
                        username: "--rest-api-username",
                        password: "--rest-api-password",
                        needed_by: "--rest-api-url",
                    },
                )?;
                Some(RestApiConfig { url, credentials })
            }
        };

        let task_env_allow = self
            .task_env_allow
            .iter()
            .filter(|name| !name.trim().is_empty())
            .map(|name| EnvPattern::parse(name.trim()).map_err(|e| err("--task-env-allow", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let ca = match &self.ca_file {
            Some(path) => Some(
                airflow::trusted_ca::TrustedCa::from_pem_file(path)
                    .map_err(|problem| err("--ca-file", problem))?,
            ),
            None => None,
        };

        let sentinel = match self.sentinel_url.as_deref() {
            None => {
                if self.sentinel_token_file.is_some() || self.sentinel_ca_file.is_some() {
                    return Err(err(
                        "--sentinel-url",
                        "is required by --sentinel-token-file and --sentinel-ca-file",
                    ));
                }
                None
            }
            Some(url) => {
                let url = http_url("--sentinel-url", Some(url))?;
                if let Some(path) = &self.sentinel_token_file {
                    let token = std::fs::read_to_string(path).map_err(|e| {
                        err(
                            "--sentinel-token-file",
                            format!("cannot read {}: {e}", path.display()),
                        )
                    })?;
                    if token.trim().is_empty() {
                        return Err(err(
                            "--sentinel-token-file",
                            format!("{} is empty", path.display()),
                        ));
                    }
                }
                let ca = match &self.sentinel_ca_file {
                    Some(path) => Some(
                        airflow::trusted_ca::TrustedCa::from_pem_file(path)
                            .map_err(|problem| err("--sentinel-ca-file", problem))?,
                    ),
                    None => None,
                };
                Some(SentinelConfig {
                    url,
                    token_file: self.sentinel_token_file,
                    ca,
                })
            }
        };

        Ok(Config {
            api_url,
            jwt_secret: Secret(jwt_secret),
            worker_name,
            queues: self.queues,
            sync_slots: self.sync_slots,
            listen: self.listen,
            admin_connections,
            heartbeat_interval: self.heartbeat_interval,
            idle_fetch_interval: self.idle_fetch_interval,
            execution_api_url,
            python: self.python,
            task_host_socket: self.task_host_socket,
            log_folder: self.log_folder,
            airflow_version: self.airflow_version,
            edge_provider_version: self.edge_provider_version,
            drain_timeout: self.drain_timeout,
            stop_budget,
            launch_mode: self.launch_mode,
            rest_api,
            task_env_allow,
            ca,
            sentinel,
            subscribed_idle_fetch_interval: self.subscribed_idle_fetch_interval,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut argv = vec![
            "astro-agent",
            "--api-url",
            "http://127.0.0.1:8080/edge_worker/v1",
            "--execution-api-url",
            "http://127.0.0.1:8080/execution/",
        ];
        argv.extend_from_slice(args);
        Flags::try_parse_from(argv).expect("flags parse")
    }

    fn validate(args: &[&str]) -> Result<Config, ConfigError> {
        flags(args).validate(Some("s3cret".into()), || Some("host-1".into()))
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = validate(&[]).unwrap();
        assert_eq!(c.sync_slots, 16);
        assert_eq!(c.queues, vec!["default"]);
        assert_eq!(c.listen.to_string(), "0.0.0.0:39091");
        assert_eq!(c.heartbeat_interval, Duration::from_secs(30));
        assert_eq!(c.idle_fetch_interval, Duration::from_secs(5));
        assert_eq!(c.worker_name, "host-1");
        assert_eq!(c.drain_timeout, None);
        assert_eq!(c.launch_mode, LaunchMode::Prefork);
        assert!(c.rest_api.is_none());
        assert_eq!(c.jwt_secret.expose(), b"s3cret");
        assert!(c.sentinel.is_none());
        assert_eq!(c.subscribed_idle_fetch_interval, Duration::from_secs(60));
        assert_eq!(
            c.admin_connections,
            AdminConnections {
                max: 32,
                per_peer: 4,
                reserved: 8
            }
        );
        assert_eq!(c.stop_budget.stop_and_report, Duration::from_secs(45));
    }

    #[test]
    fn limits_that_cannot_hold_are_refused_naming_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--drain-margin", "34s"], "--drain-margin"),
            (
                &["--admin-reserved-connections", "32"],
                "--admin-reserved-connections",
            ),
            (
                &[
                    "--admin-max-connections",
                    "4",
                    "--admin-reserved-connections",
                    "6",
                ],
                "--admin-reserved-connections",
            ),
        ];
        for (args, flag) in cases {
            let e = validate(args).unwrap_err();
            assert_eq!(e.flag, *flag, "args {args:?} gave {e}");
            assert!(!e.to_string().contains('\n'));
        }
        let c = validate(&["--drain-margin", "35s"]).unwrap();
        assert_eq!(c.stop_budget.stop_and_report, Duration::from_secs(20));
    }

    #[test]
    fn the_sentinel_subscription_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok\n").unwrap();
        let c = validate(&[
            "--sentinel-url",
            "http://sentinel:39092",
            "--sentinel-token-file",
            token.to_str().unwrap(),
            "--subscribed-idle-fetch-interval",
            "2m",
        ])
        .unwrap();
        let sentinel = c.sentinel.unwrap();
        assert_eq!(sentinel.url.as_str(), "http://sentinel:39092/");
        assert_eq!(sentinel.token_file.as_deref(), Some(token.as_path()));
        assert_eq!(c.subscribed_idle_fetch_interval, Duration::from_secs(120));
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        for (args, flag) in [
            (vec!["--sentinel-url", "sentinel:1"], "--sentinel-url"),
            (vec!["--sentinel-token-file", "/x"], "--sentinel-url"),
            (
                vec![
                    "--sentinel-url",
                    "http://s:1",
                    "--sentinel-token-file",
                    "/nonexistent/t",
                ],
                "--sentinel-token-file",
            ),
            (
                vec![
                    "--sentinel-url",
                    "http://s:1",
                    "--sentinel-token-file",
                    empty.to_str().unwrap(),
                ],
                "--sentinel-token-file",
            ),
            (
                vec![
                    "--sentinel-url",
                    "http://s:1",
                    "--sentinel-ca-file",
                    "/nonexistent/ca",
                ],
                "--sentinel-ca-file",
            ),
        ] {
            let e = validate(&args).unwrap_err();
            assert_eq!(e.flag, flag, "args {args:?} gave {e}");
        }
    }

    #[test]
    fn values_are_parsed() {
        let c = validate(&[
            "--queues",
            "a, b,c",
            "--sync-slots",
            "4",
            "--drain-timeout",
            "9m30s",
            "--worker-name",
            "w1",
            "--rest-api-url",
            "http://127.0.0.1:8080",
            "--rest-api-username",
            "admin",
            "--rest-api-password",
            "pw",
        ])
        .unwrap();
        assert_eq!(c.queues, vec!["a", "b", "c"]);
        assert_eq!(c.sync_slots, 4);
        assert_eq!(c.drain_timeout, Some(Duration::from_secs(570)));
        assert_eq!(c.worker_name, "w1");
        assert!(c.rest_api.is_some());
    }

    #[test]
    fn clap_refuses_bad_values_naming_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--sync-slots", "0"], "--sync-slots"),
            (&["--queues", "a,,b"], "--queues"),
            (&["--listen", "nowhere"], "--listen"),
            (&["--heartbeat-interval", "10ms"], "--heartbeat-interval"),
            (&["--idle-fetch-interval", "10ms"], "--idle-fetch-interval"),
            (&["--rest-api-username", "u"], "--rest-api-password"),
            (
                &["--rest-api-token", "t", "--rest-api-username", "u"],
                "--rest-api-token",
            ),
            (&["--rest-api-password", "p"], "--rest-api-username"),
            (&["--admin-max-connections", "0"], "--admin-max-connections"),
            (
                &["--admin-max-connections-per-peer", "0"],
                "--admin-max-connections-per-peer",
            ),
            (&["--drain-margin", "soon"], "--drain-margin"),
        ];
        for (args, flag) in cases {
            let argv = ["astro-agent"].iter().chain(args.iter());
            let e = Flags::try_parse_from(argv).unwrap_err().to_string();
            assert!(e.contains(flag), "args {args:?} gave {e}");
        }
    }

    #[test]
    fn each_bad_value_names_its_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--rest-api-url", "http://x:1"], "--rest-api-token"),
            (
                &["--rest-api-url", "http://x:1", "--rest-api-token", ""],
                "--rest-api-token",
            ),
            (&["--rest-api-url", "ftp://x"], "--rest-api-url"),
            (&["--worker-name", "a/b"], "--worker-name"),
            (&["--ca-file", "/nonexistent/ca.pem"], "--ca-file"),
        ];
        for (args, flag) in cases {
            let e = validate(args).unwrap_err();
            assert_eq!(e.flag, *flag, "args {args:?} gave {e}");
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn missing_required_values_are_named() {
        let e = Flags::try_parse_from(["astro-agent"])
            .unwrap()
            .validate(Some("s".into()), || None)
            .unwrap_err();
        assert_eq!(e.flag, "--api-url");
        let e = flags(&[]).validate(None, || Some("h".into())).unwrap_err();
        assert_eq!(e.flag, "--jwt-secret-file");
        let e = flags(&[]).validate(Some("s".into()), || None).unwrap_err();
        assert_eq!(e.flag, "--worker-name");
        let e = flags(&[])
            .validate(Some("\n".into()), || Some("h".into()))
            .unwrap_err();
        assert_eq!(e.flag, "--jwt-secret-file");
    }

    #[test]
    fn secret_file_is_read_and_trimmed_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "from-file\n").unwrap();
        let c = flags(&["--jwt-secret-file", path.to_str().unwrap()])
            .validate(None, || Some("h".into()))
            .unwrap();
        assert_eq!(c.jwt_secret.expose(), b"from-file");
        assert!(!format!("{c:?}").contains("from-file"));
        let e = flags(&["--jwt-secret-file", "/nonexistent/x"])
            .validate(None, || Some("h".into()))
            .unwrap_err();
        assert_eq!(e.flag, "--jwt-secret-file");
        let e = flags(&["--jwt-secret-file", path.to_str().unwrap()])
            .validate(Some("from-env".into()), || Some("h".into()))
            .unwrap_err();
        assert_eq!(e.flag, "--jwt-secret-file", "a file and a value: {e}");
    }

    #[test]
    fn rest_credentials_come_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok\n").unwrap();
        let c = validate(&[
            "--rest-api-url",
            "http://127.0.0.1:8080",
            "--rest-api-token-file",
            token.to_str().unwrap(),
        ])
        .unwrap();
        let credentials = format!("{:?}", c.rest_api.unwrap().credentials);
        assert!(credentials.starts_with("Token"), "{credentials}");
        let password = dir.path().join("password");
        std::fs::write(&password, "pw\n").unwrap();
        let c = validate(&[
            "--rest-api-url",
            "http://127.0.0.1:8080",
            "--rest-api-username",
            "admin",
            "--rest-api-password-file",
            password.to_str().unwrap(),
        ])
        .unwrap();
        match c.rest_api.unwrap().credentials {
            airflow::rest_api::RestCredentials::Password { password, .. } => {
                assert_eq!(password, "pw")
            }
            other => panic!("{other:?}"),
        }
        for (flag, file, username) in [
            ("--rest-api-token", &token, &[][..]),
            (
                "--rest-api-password",
                &password,
                &["--rest-api-username", "admin"][..],
            ),
        ] {
            let file_flag = format!("{flag}-file");
            let mut args = vec![
                "--rest-api-url",
                "http://127.0.0.1:8080",
                flag,
                "v",
                &file_flag,
                file.to_str().unwrap(),
            ];
            args.extend_from_slice(username);
            let e = validate(&args).unwrap_err();
            assert_eq!(e.flag, file_flag, "{e}");
        }
    }

    #[test]
    fn task_env_allow_takes_names_and_prefixes_but_no_secret() {
        let c = validate(&["--task-env-allow", "MY_TOKEN, AWS_*"]).unwrap();
        assert_eq!(c.task_env_allow.len(), 2);
        let e = validate(&["--task-env-allow", "OK,AIRFLOW__API_AUTH__JWT_SECRET"]).unwrap_err();
        assert_eq!(e.flag, "--task-env-allow");
        let e = validate(&["--task-env-allow", "A-B"]).unwrap_err();
        assert_eq!(e.flag, "--task-env-allow");
    }
}
