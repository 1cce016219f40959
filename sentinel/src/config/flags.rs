//! Command-line flags (each also read from `ASTRO_SENTINEL_<FLAG>`), combined with the
//! configuration file into the [`Settings`] the Sentinel runs with.
//!
//! Secrets never come from the YAML file: the Airflow token or password and the Postgres URL
//! are read from files (`--airflow-token-file` and the like, what the chart mounts) or from
//! the environment, and Kubernetes credentials from the service-account files.

use crate::config::file::{Config, PostgresCa, PostgresOptions, SourceConfig};
use crate::config::kubernetes_access::{KubernetesAccess, KubernetesFlags};
use crate::config::ConfigError;
use crate::serve::external_scaler::tls::{ExternalScalerFlags, ExternalScalerSettings};
use crate::sources::postgres::connection_url;
use airflow::rest_api::{CredentialNames, RestCredentials};
use airflow::secret_file::{value_or_file, SecretError};
use airflow::trusted_ca::TrustedCa;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;
use url::Url;

pub const DEFAULT_LISTEN: &str = "0.0.0.0:39092";
/// A few seconds: the kubelet takes up to a minute to project a ConfigMap change anyway.
pub const DEFAULT_CONFIG_CHECK_INTERVAL: &str = "5s";

#[derive(Debug, Parser)]
#[command(
    name = "astro-sentinel",
    version,
    about = "Serves each Airflow worker Deployment's backlog to KEDA's metrics-api scaler."
)]
pub struct Flags {
    /// The configuration file (YAML: workers, source, auth, intervals)
    #[arg(long, env = "ASTRO_SENTINEL_CONFIG", value_name = "PATH")]
    pub config: PathBuf,

    /// How often the configuration file is read for changes, applied without a restart
    #[arg(long, env = "ASTRO_SENTINEL_CONFIG_CHECK_INTERVAL", value_name = "DURATION",
          default_value = DEFAULT_CONFIG_CHECK_INTERVAL, value_parser = humantime::parse_duration)]
    pub config_check_interval: Duration,

    /// Address of the one HTTP port (/v1/workers, /metrics, /healthz, /readyz)
    #[arg(long, env = "ASTRO_SENTINEL_LISTEN", value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub listen: String,

    /// Log lines for people (text; colour only on a terminal) or for log pipelines (json)
    #[arg(
        long,
        env = "ASTRO_SENTINEL_LOG_FORMAT",
        value_name = "FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: logging::LogFormat,

    /// Bearer token for Airflow's REST API (source airflow-api)
    #[arg(
        long,
        env = "ASTRO_SENTINEL_AIRFLOW_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub airflow_token: Option<String>,

    /// File holding the bearer token for Airflow's REST API
    #[arg(long, env = "ASTRO_SENTINEL_AIRFLOW_TOKEN_FILE", value_name = "PATH")]
    pub airflow_token_file: Option<PathBuf>,

    /// Airflow user that logs in at /auth/token (source airflow-api), with the password below
    #[arg(long, env = "ASTRO_SENTINEL_AIRFLOW_USERNAME", value_name = "USER")]
    pub airflow_username: Option<String>,

    /// Password of --airflow-username
    #[arg(
        long,
        env = "ASTRO_SENTINEL_AIRFLOW_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    pub airflow_password: Option<String>,

    /// File holding the password of --airflow-username
    #[arg(
        long,
        env = "ASTRO_SENTINEL_AIRFLOW_PASSWORD_FILE",
        value_name = "PATH"
    )]
    pub airflow_password_file: Option<PathBuf>,

    /// PEM file of a private CA to trust for an https Airflow API, besides the built-in roots (source airflow-api)
    #[arg(long, env = "ASTRO_SENTINEL_CA_FILE", value_name = "PATH")]
    pub ca_file: Option<PathBuf>,

    /// postgres://user:password@host:port/db of the Airflow metadata database (source postgres)
    #[arg(
        long,
        env = "ASTRO_SENTINEL_POSTGRES_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub postgres_url: Option<String>,

    /// File holding the postgres:// URL of the Airflow metadata database
    #[arg(long, env = "ASTRO_SENTINEL_POSTGRES_URL_FILE", value_name = "PATH")]
    pub postgres_url_file: Option<PathBuf>,

    #[command(flatten)]
    pub kubernetes: KubernetesFlags,

    #[command(flatten)]
    pub external_scaler: ExternalScalerFlags,
}

/// Everything the Sentinel needs, validated.
#[derive(Debug)]
pub struct Settings {
    pub config: Config,
    /// Where `config` was read, read again every `config_check_interval` for changes.
    pub config_path: PathBuf,
    pub config_check_interval: Duration,
    pub listen: SocketAddr,
    pub source: SourceSettings,
    /// Set when `auth.tokenReview` (auth not disabled) or the `kubernetes` section needs the
    /// API server.
    pub kubernetes: Option<KubernetesAccess>,
    /// Set when KEDA's external scaler API is served (`--external-scaler-listen`).
    pub external_scaler: Option<ExternalScalerSettings>,
}

/// The configured source together with its credentials.
pub enum SourceSettings {
    AirflowApi {
        url: Url,
        credentials: RestCredentials,
        /// Trusted besides the built-in roots.
        ca: Option<TrustedCa>,
    },
    Postgres {
        connection: tokio_postgres::Config,
        options: PostgresOptions,
    },
}

impl std::fmt::Debug for SourceSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceSettings::AirflowApi {
                url,
                credentials,
                ca,
            } => f
                .debug_struct("AirflowApi")
                .field("url", &url.as_str())
                .field("credentials", credentials)
                .field("ca", &ca.as_ref().map(TrustedCa::path))
                .finish(),
            // tokio_postgres::Config's Debug hides the password.
            SourceSettings::Postgres {
                connection,
                options,
            } => f
                .debug_struct("Postgres")
                .field("connection", connection)
                .field("options", options)
                .finish(),
        }
    }
}

impl Settings {
    pub fn from_flags(flags: &Flags) -> Result<Settings, ConfigError> {
        let config = Config::load(&flags.config)?;
        Settings::from_parts(config, flags, |name| std::env::var(name).ok())
    }

    /// `env` looks up process environment variables that are not flags
    /// (`KUBERNETES_SERVICE_HOST/PORT`); tests pass their own.
    pub fn from_parts(
        config: Config,
        flags: &Flags,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let listen = SocketAddr::from_str(flags.listen.trim()).map_err(|e| {
            ConfigError::new(format!(
                "--listen: {:?} is not an address like 0.0.0.0:39092: {e}",
                flags.listen
            ))
        })?;
        let source = source_settings(&config.source, flags)?;
        let reviews_tokens = (config.auth.token_review.is_some()
            || config.queue_events.auth.token_review.is_some())
            && !config.auth.disabled;
        let kubernetes = if reviews_tokens || config.kubernetes.is_some() {
            Some(flags.kubernetes.access(env).map_err(ConfigError::new)?)
        } else {
            None
        };
        let external_scaler =
            ExternalScalerSettings::from_flags(&flags.external_scaler, config.auth.disabled)?;
        if flags.config_check_interval.is_zero() {
            return Err(ConfigError::new(
                "--config-check-interval: must be longer than 0 (e.g. 5s)",
            ));
        }
        Ok(Settings {
            config,
            config_path: flags.config.clone(),
            config_check_interval: flags.config_check_interval,
            listen,
            source,
            kubernetes,
            external_scaler,
        })
    }
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// A credential from its file flag or its value (flag or environment), if either is given.
fn credential(
    value: &Option<String>,
    value_flag: &'static str,
    file: &Option<PathBuf>,
    file_flag: &'static str,
) -> Result<Option<String>, ConfigError> {
    value_or_file(
        non_empty(value).map(str::to_string),
        value_flag,
        file.as_deref(),
        file_flag,
    )
    .map_err(secret_error)
}

fn secret_error(SecretError { flag, problem }: SecretError) -> ConfigError {
    ConfigError::new(format!("{flag}: {problem}"))
}

fn source_settings(source: &SourceConfig, flags: &Flags) -> Result<SourceSettings, ConfigError> {
    match source {
        SourceConfig::AirflowApi { url } => {
            let token = credential(
                &flags.airflow_token,
                "ASTRO_SENTINEL_AIRFLOW_TOKEN",
                &flags.airflow_token_file,
                "--airflow-token-file",
            )?;
            let password = credential(
                &flags.airflow_password,
                "ASTRO_SENTINEL_AIRFLOW_PASSWORD",
                &flags.airflow_password_file,
                "--airflow-password-file",
            )?;
            let credentials = RestCredentials::from_given(
                token,
                flags.airflow_username.clone(),
                password,
                CredentialNames {
                    token: "ASTRO_SENTINEL_AIRFLOW_TOKEN",
                    username: "ASTRO_SENTINEL_AIRFLOW_USERNAME",
                    password: "ASTRO_SENTINEL_AIRFLOW_PASSWORD",
                    needed_by: "source airflow-api",
                },
            )
            .map_err(secret_error)?;
            let ca = match &flags.ca_file {
                Some(path) => Some(
                    TrustedCa::from_pem_file(path)
                        .map_err(|e| ConfigError::new(format!("--ca-file: {e}")))?,
                ),
                None => None,
            };
            Ok(SourceSettings::AirflowApi {
                url: url.clone(),
                credentials,
                ca,
            })
        }
        SourceConfig::Postgres(options) => {
            let url = credential(
                &flags.postgres_url,
                "ASTRO_SENTINEL_POSTGRES_URL",
                &flags.postgres_url_file,
                "--postgres-url-file",
            )?
            .ok_or_else(|| {
                ConfigError::new("ASTRO_SENTINEL_POSTGRES_URL: required with source postgres")
            })?;
            if flags.ca_file.is_some() {
                return Err(ConfigError::new(
                    "--ca-file: is for source airflow-api; the database's CA is source.postgres.caFile",
                ));
            }
            let connection = connection_url::parse(&url, options.ssl_mode)?;
            if let Some(PostgresCa::File(ca)) = &options.ca {
                if !ca.is_file() {
                    return Err(ConfigError::new(format!(
                        "source.postgres.caFile: {} is not a readable file",
                        ca.display()
                    )));
                }
            }
            Ok(SourceSettings::Postgres {
                connection,
                options: options.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "
source:
  type: airflow-api
  airflowApi:
    url: http://airflow:8080
auth:
  staticTokensFile: /tokens
workers:
  - {name: w, queues: [a]}
";

    fn settings(args: &[&str]) -> Result<Settings, ConfigError> {
        let argv = ["astro-sentinel", "--config", "/unused.yaml"]
            .into_iter()
            .chain(args.iter().copied());
        let flags = Flags::try_parse_from(argv).unwrap();
        Settings::from_parts(Config::parse(CONFIG).unwrap(), &flags, |_| None)
    }

    #[test]
    fn credentials_come_from_files_without_their_newline() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok\n").unwrap();
        let s = settings(&["--airflow-token-file", token.to_str().unwrap()]).unwrap();
        assert!(
            matches!(&s.source, SourceSettings::AirflowApi { credentials: RestCredentials::Token(t), .. } if t == "tok")
        );
        let password = dir.path().join("password");
        std::fs::write(&password, "pw\n").unwrap();
        let s = settings(&[
            "--airflow-username",
            "admin",
            "--airflow-password-file",
            password.to_str().unwrap(),
        ])
        .unwrap();
        assert!(
            matches!(&s.source, SourceSettings::AirflowApi { credentials: RestCredentials::Password { password, .. }, .. } if password == "pw")
        );
    }

    #[test]
    fn a_file_and_a_value_together_name_the_file_flag() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok").unwrap();
        let e = settings(&[
            "--airflow-token",
            "t",
            "--airflow-token-file",
            token.to_str().unwrap(),
        ])
        .unwrap_err();
        assert!(e.to_string().starts_with("--airflow-token-file: "), "{e}");
        let e = settings(&["--airflow-token-file", "/nonexistent/token"]).unwrap_err();
        assert!(e.to_string().starts_with("--airflow-token-file: "), "{e}");
    }
}
