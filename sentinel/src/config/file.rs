//! The configuration file (YAML, camelCase keys, unknown keys rejected) and its validation.
//!
//! Parsing happens in two steps so that every error is one line naming what is wrong: the file
//! is first read into raw structs that mirror its shape, then `validate` turns them into a
//! [`Config`] whose values are known to be usable. Workers are parsed one by one so that even
//! a typo in a key can name the worker it sits in. Durations are humantime's (`2s`, `1m30s`).

use super::pre_warm::{self, PreWarmConfig, RawPreWarm, RawSchedule, ScheduleConfig};
use super::queue_events::{validate_queue_events, QueueEventsConfig, RawQueueEvents};
use super::worker_labels::validate_worker_labels;
use super::ConfigError;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use url::Url;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// How often each queue is counted upstream.
    pub refresh_interval: Duration,
    /// A queue value older than this is not served (its workers answer 503).
    pub staleness_limit: Duration,
    /// How often the task instances Airflow holds back (`scheduled`) are counted.
    pub held_tasks_interval: Duration,
    pub source: SourceConfig,
    pub auth: AuthConfig,
    pub workers: Vec<WorkerConfig>,
    /// The cluster side: the workers' Deployments and pods, read from the Kubernetes API.
    pub kubernetes: Option<KubernetesConfig>,
    pub history: HistoryConfig,
    /// Pre-warm from Airflow's schedule: the reader's cadence and each worker's settings.
    pub schedule: ScheduleConfig,
    /// The agents' wake-up stream (`GET /v1/queues/events`).
    pub queue_events: QueueEventsConfig,
    /// The workers an HPA scales (`scaledBy: hpa`): recorded in the history, never read by KEDA.
    pub hpa_scaled: BTreeSet<String>,
}

/// Where the scaling history is kept across restarts; `None`: in memory only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryConfig {
    pub path: Option<PathBuf>,
    /// The folder of `path` goes with the Pod (an `emptyDir`): the page says the history is
    /// lost when the Pod is.
    pub volatile: bool,
}

/// What scales a worker Deployment: KEDA (reading the Sentinel) or an HPA (on the agents'
/// own metrics; the Sentinel only records its history).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaledBy {
    #[default]
    Keda,
    Hpa,
}

/// What the Sentinel reads and writes in the workers' namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// Where the worker Deployments (named as the workers) and their pods live.
    pub namespace: String,
    /// Keep each worker pod's `controller.kubernetes.io/pod-deletion-cost` equal to the task
    /// slots it runs, so that a scale-in removes idle pods first.
    pub idle_first_scale_in: bool,
    /// Labels every worker Deployment, Pod and ScaledObject carries: the watches select on
    /// them; empty selects everything in the namespace.
    pub worker_labels: BTreeMap<String, String>,
    /// The Lease whose holder alone sets the deletion costs (several replicas); None: this
    /// replica sets them without asking.
    pub deletion_cost_lease: Option<String>,
}

/// Where backlog counts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceConfig {
    /// Airflow's public REST API v2 at this base URL (`http://host:port`).
    AirflowApi { url: Url },
    /// The Airflow metadata database (the URL with credentials comes from the environment).
    Postgres(PostgresOptions),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    pub ssl_mode: SslMode,
    /// What the server's certificate must chain to (libpq's `sslrootcert`); always set for
    /// `verify-ca` and `verify-full`.
    pub ca: Option<PostgresCa>,
}

/// libpq's `sslrootcert`: a PEM file, or `system` for the operating system's trusted roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostgresCa {
    File(PathBuf),
    System,
}

/// As libpq spells it: `sslrootcert=system`.
const SYSTEM_CA: &str = "system";

/// Certificates are checked unless the file says otherwise: the database holds credentials
/// and the backlog that scaling acts on.
pub const DEFAULT_SSL_MODE: SslMode = SslMode::VerifyFull;

/// libpq's `sslmode` values, with libpq's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// The spelling of the YAML file and of libpq.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// `true` only when the file says `disabled: true`.
    pub disabled: bool,
    pub static_tokens_file: Option<PathBuf>,
    pub token_review: Option<TokenReviewConfig>,
    /// People read the workers whose Deployment their own Kubernetes token may `get`; how
    /// long the API server's answers are kept. `None`: off.
    pub kubernetes_users: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenReviewConfig {
    pub allowed_usernames: Vec<String>,
    /// Audiences the review asks for; empty: the API server's own.
    pub audiences: Vec<String>,
    pub cache_ttl: Duration,
}

/// One worker Deployment and the queues it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    pub name: String,
    pub queues: Vec<String>,
    pub sync_slots: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Headroom: slots kept free above the work while the pool has any, so a burst finds
    /// capacity at once while more Pods (and the nodes under them) come.
    pub overprovision_slots: u32,
}

pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(2);
pub const DEFAULT_STALENESS_LIMIT: Duration = Duration::from_secs(30);
/// Held-back tasks feed a finding over minutes, not a scaling input: counting them at every
/// refresh would double the airflow-api source's cost per refresh (one count per queue).
pub const DEFAULT_HELD_TASKS_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_TOKEN_REVIEW_CACHE_TTL: Duration = Duration::from_secs(60);
/// KEDA's bound tokens live one hour; a cached verdict must end well before the token does.
pub const MAX_TOKEN_REVIEW_CACHE_TTL: Duration = Duration::from_secs(600);
pub const DEFAULT_SYNC_SLOTS: u32 = 16;
pub const DEFAULT_MIN_REPLICAS: u32 = 0;
pub const DEFAULT_MAX_REPLICAS: u32 = 10;

// ---- the file's shape ---------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    #[serde(default, with = "humantime_serde")]
    refresh_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    staleness_limit: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    held_tasks_interval: Option<Duration>,
    source: Option<RawSource>,
    #[serde(default)]
    auth: Option<RawAuth>,
    /// Kept as raw values so each worker is parsed on its own (see the module doc).
    #[serde(default)]
    workers: Option<Vec<serde_yaml::Value>>,
    kubernetes: Option<RawKubernetes>,
    #[serde(default)]
    history: Option<RawHistory>,
    schedule: Option<RawSchedule>,
    queue_events: Option<RawQueueEvents>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawHistory {
    path: Option<PathBuf>,
    #[serde(default)]
    volatile: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawKubernetes {
    namespace: Option<String>,
    #[serde(default)]
    idle_first_scale_in: bool,
    #[serde(default)]
    worker_labels: BTreeMap<String, String>,
    deletion_cost_lease: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSource {
    #[serde(rename = "type")]
    kind: Option<SourceKind>,
    airflow_api: Option<RawAirflowApi>,
    postgres: Option<RawPostgres>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "kebab-case")]
enum SourceKind {
    AirflowApi,
    Postgres,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAirflowApi {
    url: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPostgres {
    ssl_mode: Option<SslMode>,
    ca_file: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAuth {
    #[serde(default)]
    disabled: bool,
    static_tokens_file: Option<PathBuf>,
    token_review: Option<RawTokenReview>,
    kubernetes_users: Option<RawKubernetesUsers>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawKubernetesUsers {
    #[serde(default, with = "humantime_serde")]
    cache_ttl: Option<Duration>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawTokenReview {
    #[serde(default)]
    allowed_usernames: Vec<String>,
    #[serde(default)]
    audiences: Vec<String>,
    #[serde(default, with = "humantime_serde")]
    cache_ttl: Option<Duration>,
}

/// One entry of `workers`, deserialized on its own (see the module doc).
#[derive(Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    expecting = "a mapping with the keys name, queues, syncSlots, minReplicas, maxReplicas, preWarm, scaledBy"
)]
struct RawWorker {
    name: Option<String>,
    queues: Option<QueueList>,
    sync_slots: Option<u32>,
    min_replicas: Option<u32>,
    max_replicas: Option<u32>,
    pre_warm: Option<RawPreWarm>,
    scaled_by: Option<ScaledBy>,
    overprovision_slots: Option<u32>,
}

// ---- loading ------------------------------------------------------------------------------

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(format!("--config {}: {e}", path.display())))?;
        Config::parse(&text)
    }

    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig =
            serde_yaml::from_str(text).map_err(|e| ConfigError::new(e.to_string()))?;
        validate(raw)
    }

    /// Every queue any worker serves, each once, in first-seen order.
    pub fn distinct_queues(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.workers
            .iter()
            .flat_map(|w| w.queues.iter())
            .filter(|q| seen.insert(q.as_str()))
            .cloned()
            .collect()
    }
}

fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let refresh_interval = raw.refresh_interval.unwrap_or(DEFAULT_REFRESH_INTERVAL);
    if refresh_interval.is_zero() {
        return Err(ConfigError::new("refreshInterval: must be longer than 0"));
    }
    let staleness_limit = raw.staleness_limit.unwrap_or(DEFAULT_STALENESS_LIMIT);
    if staleness_limit < refresh_interval {
        return Err(ConfigError::new(format!(
            "stalenessLimit: must be at least refreshInterval ({}), got {}",
            humantime::format_duration(refresh_interval),
            humantime::format_duration(staleness_limit)
        )));
    }
    let held_tasks_interval = raw
        .held_tasks_interval
        .unwrap_or(DEFAULT_HELD_TASKS_INTERVAL);
    if held_tasks_interval < refresh_interval {
        return Err(ConfigError::new(format!(
            "heldTasksInterval: must be at least refreshInterval ({}), got {}",
            humantime::format_duration(refresh_interval),
            humantime::format_duration(held_tasks_interval)
        )));
    }
    let source = validate_source(raw.source)?;
    let auth = validate_auth(raw.auth.unwrap_or_default())?;
    let history = validate_history(raw.history.unwrap_or_default())?;
    let mut schedule = ScheduleConfig {
        read_interval: pre_warm::read_interval(raw.schedule)?,
        ..ScheduleConfig::default()
    };
    let queue_events = validate_queue_events(raw.queue_events.unwrap_or_default())?;

    let mut workers = Vec::new();
    let mut hpa_scaled = BTreeSet::new();
    let mut first_index: HashMap<String, usize> = HashMap::new();
    for (index, value) in raw.workers.unwrap_or_default().into_iter().enumerate() {
        let (worker, pre_warm, scaled_by) = validate_worker(index, value)?;
        if let Some(first) = first_index.get(&worker.name) {
            return Err(ConfigError::new(format!(
                "worker \"{}\": name: duplicate (workers[{first}] and workers[{index}] have the same name)",
                worker.name
            )));
        }
        first_index.insert(worker.name.clone(), index);
        if scaled_by == ScaledBy::Hpa {
            hpa_scaled.insert(worker.name.clone());
        }
        schedule.workers.insert(worker.name.clone(), pre_warm);
        workers.push(worker);
    }

    let kubernetes = raw.kubernetes.map(validate_kubernetes).transpose()?;
    if auth.kubernetes_users.is_some() && kubernetes.is_none() {
        return Err(ConfigError::new(
            "auth.kubernetesUsers: needs kubernetes.namespace (where the worker Deployments whose access it checks live)",
        ));
    }

    Ok(Config {
        refresh_interval,
        staleness_limit,
        held_tasks_interval,
        source,
        auth,
        workers,
        history,
        kubernetes,
        schedule,
        queue_events,
        hpa_scaled,
    })
}

fn validate_kubernetes(raw: RawKubernetes) -> Result<KubernetesConfig, ConfigError> {
    let namespace = raw
        .namespace
        .ok_or_else(|| ConfigError::new("kubernetes.namespace: missing"))?;
    // A DNS-1123 label, as the API server requires of a namespace name.
    let valid = !namespace.is_empty()
        && namespace.len() <= 63
        && namespace
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !namespace.starts_with('-')
        && !namespace.ends_with('-');
    if !valid {
        return Err(ConfigError::new(format!(
            "kubernetes.namespace: {namespace:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        )));
    }
    if let Some(lease) = raw.deletion_cost_lease.as_deref() {
        if !is_object_name(lease) {
            return Err(ConfigError::new(format!(
                "kubernetes.deletionCostLease: {lease:?} is not a Kubernetes object name (lowercase letters, digits, '-', '.', at most 253)"
            )));
        }
    }
    Ok(KubernetesConfig {
        namespace,
        idle_first_scale_in: raw.idle_first_scale_in,
        worker_labels: validate_worker_labels(raw.worker_labels)?,
        deletion_cost_lease: raw.deletion_cost_lease,
    })
}

fn validate_history(raw: RawHistory) -> Result<HistoryConfig, ConfigError> {
    let Some(path) = raw.path else {
        if raw.volatile {
            return Err(ConfigError::new(
                "history.volatile: says where history.path lies, and history.path is not set",
            ));
        }
        return Ok(HistoryConfig::default());
    };
    let text = path.to_string_lossy();
    if text.trim().is_empty() || text.ends_with('/') || path.file_name().is_none() {
        return Err(ConfigError::new(format!(
            "history.path: {text:?} is not a file path (e.g. /var/lib/astro-sentinel/history.bin)"
        )));
    }
    Ok(HistoryConfig {
        path: Some(path),
        volatile: raw.volatile,
    })
}

fn validate_source(raw: Option<RawSource>) -> Result<SourceConfig, ConfigError> {
    let raw = raw.ok_or_else(|| ConfigError::new("source: missing (set source.type)"))?;
    let kind = raw
        .kind
        .ok_or_else(|| ConfigError::new("source.type: missing (one of airflow-api, postgres)"))?;
    // The section of the other source may be present (a chart can render both); only the
    // one named by `type` is used.
    match kind {
        SourceKind::AirflowApi => {
            let url = raw
                .airflow_api
                .and_then(|a| a.url)
                .ok_or_else(|| ConfigError::new("source.airflowApi.url: missing"))?;
            let parsed = Url::parse(&url).map_err(|e| {
                ConfigError::new(format!("source.airflowApi.url: invalid URL {url:?}: {e}"))
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ConfigError::new(format!(
                    "source.airflowApi.url: must start with http:// or https://, got {url:?}"
                )));
            }
            Ok(SourceConfig::AirflowApi { url: parsed })
        }
        SourceKind::Postgres => Ok(SourceConfig::Postgres(postgres_options(
            raw.postgres.unwrap_or_default(),
        )?)),
    }
}

/// libpq's rules: `verify-ca` and `verify-full` need a root certificate, and
/// `sslrootcert=system` is only accepted with `verify-full`. Unlike libpq there is no
/// `~/.postgresql/root.crt` default: a container has no such home file, so the CA is named.
fn postgres_options(raw: RawPostgres) -> Result<PostgresOptions, ConfigError> {
    let ssl_mode = raw.ssl_mode.unwrap_or(DEFAULT_SSL_MODE);
    let ca = match raw.ca_file.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(SYSTEM_CA) => Some(PostgresCa::System),
        Some(path) => Some(PostgresCa::File(PathBuf::from(path))),
    };
    match (ssl_mode, &ca) {
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => Err(ConfigError::new(format!(
            "source.postgres.caFile: sslMode {ssl_mode} checks the server's certificate and \
             needs the CA that signed it: set caFile to its PEM file, or to `system` for the \
             system's trusted roots (with verify-full), or choose a weaker sslMode"
        ))),
        (mode, Some(PostgresCa::System)) if mode != SslMode::VerifyFull => {
            Err(ConfigError::new(format!(
                "source.postgres.caFile: `system` needs sslMode verify-full (as in libpq), got {mode}"
            )))
        }
        _ => Ok(PostgresOptions { ssl_mode, ca }),
    }
}

fn validate_auth(raw: RawAuth) -> Result<AuthConfig, ConfigError> {
    let token_review = raw
        .token_review
        .map(|tr| validate_token_review(tr, "auth.tokenReview"))
        .transpose()?;
    if !raw.disabled && raw.static_tokens_file.is_none() && token_review.is_none() {
        return Err(ConfigError::new(
            "auth: no method configured: set auth.staticTokensFile and/or auth.tokenReview, \
             or auth.disabled: true to serve /v1 without authentication",
        ));
    }
    let kubernetes_users = raw
        .kubernetes_users
        .map(|users| cache_ttl(users.cache_ttl, "auth.kubernetesUsers"))
        .transpose()?;
    Ok(AuthConfig {
        disabled: raw.disabled,
        static_tokens_file: raw.static_tokens_file,
        token_review,
        kubernetes_users,
    })
}

/// Checks a `tokenReview` section; `key` is where it sits, for the messages.
pub(super) fn validate_token_review(
    tr: RawTokenReview,
    key: &str,
) -> Result<TokenReviewConfig, ConfigError> {
    if tr.allowed_usernames.is_empty() {
        return Err(ConfigError::new(format!(
            "{key}.allowedUsernames: must list at least one username"
        )));
    }
    if let Some(bad) = tr.allowed_usernames.iter().find(|u| u.trim().is_empty()) {
        return Err(ConfigError::new(format!(
            "{key}.allowedUsernames: empty username {bad:?}"
        )));
    }
    if let Some(bad) = tr
        .audiences
        .iter()
        .find(|a| a.is_empty() || a.trim() != a.as_str())
    {
        return Err(ConfigError::new(format!(
            "{key}.audiences: {bad:?} is empty or has surrounding whitespace"
        )));
    }
    Ok(TokenReviewConfig {
        allowed_usernames: tr.allowed_usernames,
        audiences: tr.audiences,
        cache_ttl: cache_ttl(tr.cache_ttl, key)?,
    })
}

/// The `cacheTtl` of the `key` section: how long the API server's verdicts are kept.
fn cache_ttl(raw: Option<Duration>, key: &str) -> Result<Duration, ConfigError> {
    let ttl = raw.unwrap_or(DEFAULT_TOKEN_REVIEW_CACHE_TTL);
    if ttl.is_zero() || ttl > MAX_TOKEN_REVIEW_CACHE_TTL {
        return Err(ConfigError::new(format!(
            "{key}.cacheTtl: must be between 1s and {}, got {}",
            humantime::format_duration(MAX_TOKEN_REVIEW_CACHE_TTL),
            humantime::format_duration(ttl)
        )));
    }
    Ok(ttl)
}

/// Checks one worker entry and its pre-warm settings; every message starts with the worker it
/// concerns.
fn validate_worker(
    index: usize,
    value: serde_yaml::Value,
) -> Result<(WorkerConfig, PreWarmConfig, ScaledBy), ConfigError> {
    // Name the worker in every message, even when the rest of the entry does not parse.
    let label = match value.get("name").and_then(|n| n.as_str()) {
        Some(name) => format!("worker \"{name}\""),
        None => format!("workers[{index}]"),
    };
    let fail = |what: String| ConfigError::new(format!("{label}: {what}"));
    let pre_warm_asked = value
        .get("preWarm")
        .and_then(|p| p.get("enabled"))
        .and_then(serde_yaml::Value::as_bool)
        == Some(true);
    let raw: RawWorker = serde_path_to_error::deserialize(value).map_err(|e| {
        // The path is the key of a value that does not parse, "." for the entry as a whole
        // (an unknown key, not a mapping).
        match e.path().to_string().as_str() {
            "." => fail(e.inner().to_string()),
            key => fail(format!("{key}: {}", e.inner())),
        }
    })?;
    let name = raw.name.ok_or_else(|| fail("name: missing".into()))?;
    if !is_object_name(&name) {
        return Err(fail(format!(
            "name: {name:?} is not a Kubernetes object name (lowercase letters, digits, '-', '.', at most 253)"
        )));
    }
    let queues = raw.queues.map(|QueueList(q)| q).unwrap_or_default();
    if queues.is_empty() {
        return Err(fail("queues: must list at least one queue".into()));
    }
    let mut seen = std::collections::HashSet::new();
    for queue in &queues {
        if queue.is_empty() {
            return Err(fail("queues: empty queue name".into()));
        }
        if !seen.insert(queue) {
            return Err(fail(format!("queues: {queue:?} is listed twice")));
        }
    }
    let sync_slots = raw.sync_slots.unwrap_or(DEFAULT_SYNC_SLOTS);
    if sync_slots < 1 {
        return Err(fail(format!(
            "syncSlots: must be at least 1, got {sync_slots}"
        )));
    }
    let min_replicas = raw.min_replicas.unwrap_or(DEFAULT_MIN_REPLICAS);
    let max_replicas = raw.max_replicas.unwrap_or(DEFAULT_MAX_REPLICAS);
    if min_replicas > max_replicas {
        return Err(fail(format!(
            "minReplicas: {min_replicas} is greater than maxReplicas {max_replicas}"
        )));
    }
    let scaled_by = raw.scaled_by.unwrap_or_default();
    let overprovision_slots = raw.overprovision_slots.unwrap_or(0);
    if overprovision_slots > 0 && scaled_by == ScaledBy::Hpa {
        return Err(fail(
            "overprovisionSlots: an HPA-scaled worker (scaledBy: hpa) scales on its agents' own queue stats, which hold no headroom: only KEDA reads it".into(),
        ));
    }
    let capacity = u64::from(max_replicas) * u64::from(sync_slots);
    if u64::from(overprovision_slots) >= capacity.max(1) {
        return Err(fail(format!(
            "overprovisionSlots: {overprovision_slots} is not below the pool's capacity (maxReplicas {max_replicas} × syncSlots {sync_slots} = {capacity}): the pool would always be at its maximum"
        )));
    }
    let mut pre_warm = pre_warm::validate(raw.pre_warm, fail)?;
    if scaled_by == ScaledBy::Hpa && !pre_warm_asked {
        // An HPA reads the expected slots only through a second metric of its own
        // (astro_sentinel_worker_expected_slots through prometheus-adapter), which the chart
        // adds where asked: off unless the entry asks.
        pre_warm.enabled = false;
    }
    Ok((
        WorkerConfig {
            name,
            queues,
            sync_slots,
            min_replicas,
            max_replicas,
            overprovision_slots,
        },
        pre_warm,
        scaled_by,
    ))
}

/// A DNS-1123 subdomain: what Kubernetes accepts as a Deployment name. Such a name is also
/// safe as a URL path segment, which is how KEDA asks for it.
fn is_object_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 253
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'.')
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

// ---- field formats ------------------------------------------------------------------------

/// A list of queue names; a comma-separated string is accepted too (the agent's `--queues`
/// form), so a chart can pass the same value to both.
struct QueueList(Vec<String>);

impl<'de> Deserialize<'de> for QueueList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = QueueList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of queue names")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(QueueList(
                    s.split(',').map(|q| q.trim().to_string()).collect(),
                ))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(q) = seq.next_element::<String>()? {
                    out.push(q.trim().to_string());
                }
                Ok(QueueList(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
source:
  type: airflow-api
  airflowApi:
    url: http://airflow:8080
auth:
  staticTokensFile: /tokens
";

    fn with_workers(workers: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!("{BASE}workers:\n{workers}"))
    }

    #[test]
    fn the_kubernetes_section_names_its_namespace() {
        let c = Config::parse(&format!(
            "{BASE}kubernetes:\n  namespace: airflow-workers\n  idleFirstScaleIn: true\n"
        ))
        .unwrap();
        assert_eq!(
            c.kubernetes,
            Some(KubernetesConfig {
                namespace: "airflow-workers".into(),
                idle_first_scale_in: true,
                worker_labels: BTreeMap::new(),
                deletion_cost_lease: None,
            })
        );
        let leased = Config::parse(&format!(
            "{BASE}kubernetes:\n  namespace: a\n  deletionCostLease: rel-sentinel-deletion-cost\n"
        ))
        .unwrap();
        assert_eq!(
            leased.kubernetes.unwrap().deletion_cost_lease.as_deref(),
            Some("rel-sentinel-deletion-cost")
        );
        let bad_lease = Config::parse(&format!(
            "{BASE}kubernetes:\n  namespace: a\n  deletionCostLease: Not_A_Name\n"
        ))
        .unwrap_err()
        .0;
        assert!(
            bad_lease.starts_with("kubernetes.deletionCostLease: \"Not_A_Name\""),
            "{bad_lease}"
        );
        let selected = Config::parse(&format!(
            "{BASE}kubernetes:\n  namespace: a\n  workerLabels: {{component: worker, app.kubernetes.io/instance: r}}\n"
        ))
        .unwrap();
        assert_eq!(
            selected.kubernetes.unwrap().worker_labels,
            BTreeMap::from([
                ("app.kubernetes.io/instance".to_string(), "r".to_string()),
                ("component".to_string(), "worker".to_string()),
            ])
        );
        let bad_label = Config::parse(&format!(
            "{BASE}kubernetes:\n  namespace: a\n  workerLabels: {{component: 'two words'}}\n"
        ))
        .unwrap_err()
        .0;
        assert!(
            bad_label.starts_with("kubernetes.workerLabels.component:"),
            "{bad_label}"
        );
        assert_eq!(Config::parse(BASE).unwrap().kubernetes, None);
        let missing = Config::parse(&format!("{BASE}kubernetes:\n  idleFirstScaleIn: true\n"))
            .unwrap_err()
            .0;
        assert_eq!(missing, "kubernetes.namespace: missing");
        let bad = Config::parse(&format!(
            "{BASE}kubernetes:\n  namespace: Airflow_Workers\n"
        ))
        .unwrap_err()
        .0;
        assert!(
            bad.starts_with("kubernetes.namespace: \"Airflow_Workers\""),
            "{bad}"
        );
        let unknown = Config::parse(&format!(
            "{BASE}kubernetes:\n  namespace: a\n  idleFirst: true\n"
        ))
        .unwrap_err()
        .0;
        assert!(unknown.contains("idleFirst"), "{unknown}");
    }

    #[test]
    fn the_documented_example_parses_with_defaults() {
        let c = Config::parse(
            "
refreshInterval: 2s
stalenessLimit: 30s
source:
  type: airflow-api
  airflowApi:
    url: http://airflow-api-server:8080
  postgres:
    sslMode: verify-full
    caFile: /path/ca.crt
auth:
  disabled: false
  staticTokensFile: /etc/astro-sentinel/tokens/tokens
  tokenReview:
    allowedUsernames: [\"system:serviceaccount:keda:astro-agent-keda\"]
    audiences: [\"astro-sentinel\"]
    cacheTtl: 60s
workers:
  - name: astro-worker-default
    queues: [\"default\"]
    syncSlots: 16
    minReplicas: 0
    maxReplicas: 10
  - name: astro-worker-etl
    queues: \"etl, heavy\"
",
        )
        .unwrap();
        assert_eq!(c.refresh_interval, Duration::from_secs(2));
        assert_eq!(c.staleness_limit, Duration::from_secs(30));
        assert!(matches!(c.source, SourceConfig::AirflowApi { .. }));
        assert_eq!(c.workers.len(), 2);
        assert_eq!(c.workers[1].queues, vec!["etl", "heavy"]);
        assert_eq!(c.workers[1].sync_slots, DEFAULT_SYNC_SLOTS);
        assert_eq!(c.workers[1].max_replicas, DEFAULT_MAX_REPLICAS);
        let tr = c.auth.token_review.unwrap();
        assert_eq!(tr.cache_ttl, Duration::from_secs(60));
        assert_eq!(tr.audiences, vec!["astro-sentinel"]);
    }

    #[test]
    fn defaults_apply() {
        let c = with_workers("  - {name: w, queues: [a]}\n").unwrap();
        assert_eq!(c.refresh_interval, DEFAULT_REFRESH_INTERVAL);
        assert_eq!(c.staleness_limit, DEFAULT_STALENESS_LIMIT);
        assert_eq!(c.held_tasks_interval, DEFAULT_HELD_TASKS_INTERVAL);
    }

    #[test]
    fn distinct_queues_lists_each_queue_once() {
        let c = with_workers(
            "  - {name: a, queues: [q1, q2]}\n  - {name: b, queues: [q2, q3]}\n  - {name: c, queues: [q1]}\n",
        )
        .unwrap();
        assert_eq!(c.distinct_queues(), vec!["q1", "q2", "q3"]);
    }

    fn err(workers: &str) -> String {
        let e = with_workers(workers).unwrap_err().0;
        assert!(!e.contains('\n'), "not one line: {e}");
        e
    }

    #[test]
    fn worker_errors_name_worker_and_field() {
        let e = err("  - {name: w1, queues: [a], syncSlots: 0}\n");
        assert!(
            e.contains("worker \"w1\"") && e.contains("syncSlots"),
            "{e}"
        );
        let e = err("  - {name: w2, queues: []}\n");
        assert!(e.contains("worker \"w2\"") && e.contains("queues"), "{e}");
        let e = err("  - {name: w3}\n");
        assert!(e.contains("worker \"w3\"") && e.contains("queues"), "{e}");
        let e = err("  - {name: w4, queues: [a], minReplicas: 3, maxReplicas: 2}\n");
        assert!(
            e.contains("worker \"w4\"") && e.contains("minReplicas"),
            "{e}"
        );
        let e = err("  - {name: w5, queues: [a], queus: [b]}\n");
        assert!(e.contains("worker \"w5\"") && e.contains("queus"), "{e}");
        let e = err("  - {name: w6, queues: [a]}\n  - {name: w6, queues: [b]}\n");
        assert!(
            e.contains("worker \"w6\"") && e.contains("duplicate"),
            "{e}"
        );
        let e = err("  - {name: w7, queues: [a, a]}\n");
        assert!(e.contains("worker \"w7\"") && e.contains("queues"), "{e}");
        let e = err("  - {name: W_8, queues: [a]}\n");
        assert!(e.contains("W_8") && e.contains("name"), "{e}");
        let e = err("  - {queues: [a]}\n");
        assert!(e.contains("workers[0]") && e.contains("name"), "{e}");
        let e = err("  - just-a-name\n");
        assert!(e.contains("workers[0]") && e.contains("mapping"), "{e}");
        let e = err("  - {name: w9, queues: [a], syncSlots: -1}\n");
        assert!(
            e.contains("worker \"w9\"") && e.contains("syncSlots"),
            "{e}"
        );
        let e = err("  - {name: w10, queues: [a], maxReplicas: many}\n");
        assert!(
            e.contains("worker \"w10\"") && e.contains("maxReplicas"),
            "{e}"
        );
    }

    #[test]
    fn top_level_errors_name_the_field() {
        let e = Config::parse(&format!("{BASE}refreshInteval: 2s\n"))
            .unwrap_err()
            .0;
        assert!(e.contains("refreshInteval"), "{e}");
        let e = Config::parse(&format!("{BASE}refreshInterval: soon\n"))
            .unwrap_err()
            .0;
        assert!(e.contains("refreshInterval") || e.contains("soon"), "{e}");
        let e = Config::parse(&format!("{BASE}stalenessLimit: 1s\n"))
            .unwrap_err()
            .0;
        assert!(e.contains("stalenessLimit"), "{e}");
        let e = Config::parse(
            "source: {type: airflow-api, airflowApi: {url: 'http://a'}}\nauth: {staticTokensFile: /t, kubernetesUsers: {}}\n",
        )
        .unwrap_err()
        .0;
        assert!(
            e.starts_with("auth.kubernetesUsers: needs kubernetes.namespace"),
            "{e}"
        );
        let e = Config::parse(&format!("{BASE}heldTasksInterval: 1s\n"))
            .unwrap_err()
            .0;
        assert!(
            e.starts_with("heldTasksInterval: must be at least refreshInterval"),
            "{e}"
        );
        let e = Config::parse("source: {type: mysql}\nauth: {disabled: true}\n")
            .unwrap_err()
            .0;
        assert!(e.contains("mysql"), "{e}");
        let e = Config::parse("source: {type: airflow-api}\nauth: {disabled: true}\n")
            .unwrap_err()
            .0;
        assert!(e.contains("source.airflowApi.url"), "{e}");
        const PG: &str = "source: {type: postgres, postgres: {sslMode: disable}}";
        let e = Config::parse(&format!("{PG}\n")).unwrap_err().0;
        assert!(e.starts_with("auth"), "{e}");
        let e = Config::parse(&format!(
            "{PG}\nauth: {{tokenReview: {{allowedUsernames: []}}}}\n"
        ))
        .unwrap_err()
        .0;
        assert!(e.contains("allowedUsernames"), "{e}");
        let e = Config::parse(&format!(
            "{PG}\nauth: {{tokenReview: {{allowedUsernames: [u], audiences: [\" x\"]}}}}\n"
        ))
        .unwrap_err()
        .0;
        assert!(e.contains("auth.tokenReview.audiences"), "{e}");
    }

    #[test]
    fn headroom_is_below_the_pools_capacity_and_keda_only() {
        let worker = |extra: &str| {
            Config::parse(&format!(
                "{BASE}workers:\n  - {{name: k, queues: [a], syncSlots: 4, maxReplicas: 3{extra}}}\n"
            ))
        };
        assert_eq!(worker("").unwrap().workers[0].overprovision_slots, 0);
        assert_eq!(
            worker(", overprovisionSlots: 11").unwrap().workers[0].overprovision_slots,
            11
        );
        let e = worker(", overprovisionSlots: 12").unwrap_err().0;
        assert!(
            e.starts_with("worker \"k\": overprovisionSlots: 12 is not below the pool's capacity"),
            "{e}"
        );
        let e = worker(", overprovisionSlots: 2, scaledBy: hpa")
            .unwrap_err()
            .0;
        assert!(
            e.starts_with("worker \"k\": overprovisionSlots: an HPA-scaled worker"),
            "{e}"
        );
        let e = worker(", overprovisionSlots: -1").unwrap_err().0;
        assert!(e.starts_with("worker \"k\": overprovisionSlots:"), "{e}");
    }

    #[test]
    fn hpa_scaled_workers_are_listed_and_pre_warmed_only_when_asked() {
        let c = Config::parse(&format!(
            "{BASE}workers:\n  - {{name: k, queues: [a]}}\n  - {{name: h, queues: [b], scaledBy: hpa}}\n"
        ))
        .unwrap();
        assert_eq!(c.hpa_scaled, BTreeSet::from(["h".to_string()]));
        assert!(c.schedule.for_worker("k").enabled);
        assert!(!c.schedule.for_worker("h").enabled, "off by default");
        let c = Config::parse(&format!(
            "{BASE}workers:\n  - {{name: h, queues: [b], scaledBy: hpa, preWarm: {{enabled: true}}}}\n"
        ))
        .unwrap();
        assert!(c.schedule.for_worker("h").enabled);
        let e = Config::parse(&format!(
            "{BASE}workers:\n  - {{name: h, queues: [b], scaledBy: argo}}\n"
        ))
        .unwrap_err()
        .0;
        assert!(e.contains("scaledBy"), "{e}");
    }

    #[test]
    fn a_volatile_history_needs_its_path() {
        let c = Config::parse(&format!(
            "{BASE}history: {{path: /h/x.bin, volatile: true}}\n"
        ))
        .unwrap();
        assert!(c.history.volatile);
        let e = Config::parse(&format!("{BASE}history: {{volatile: true}}\n"))
            .unwrap_err()
            .0;
        assert!(e.starts_with("history.volatile"), "{e}");
    }

    #[test]
    fn history_path_is_optional_and_must_name_a_file() {
        let c = with_workers("  - {name: w, queues: [a]}\n").unwrap();
        assert_eq!(c.history.path, None, "memory only by default");
        let c = Config::parse(&format!(
            "{BASE}history:\n  path: /var/lib/astro-sentinel/history.bin\n"
        ))
        .unwrap();
        assert_eq!(
            c.history.path.as_deref(),
            Some(Path::new("/var/lib/astro-sentinel/history.bin"))
        );
        for bad in ["\"\"", "/var/lib/astro-sentinel/", "/var/lib/.."] {
            let e = Config::parse(&format!("{BASE}history:\n  path: {bad}\n"))
                .unwrap_err()
                .0;
            assert!(e.starts_with("history.path:"), "{bad}: {e}");
        }
        let e = Config::parse(&format!("{BASE}history:\n  file: /x\n"))
            .unwrap_err()
            .0;
        assert!(e.contains("file") && e.contains("path"), "{e}");
    }

    #[test]
    fn auth_off_only_when_explicit() {
        let c = Config::parse(
            "source: {type: postgres, postgres: {sslMode: disable}}\nauth: {disabled: true}\n",
        )
        .unwrap();
        assert!(c.auth.disabled);
    }

    fn postgres(options: &str) -> Result<PostgresOptions, String> {
        let yaml = format!("source: {{type: postgres, postgres: {options}}}\n{BASE_AUTH}");
        match Config::parse(&yaml) {
            Ok(c) => match c.source {
                SourceConfig::Postgres(o) => Ok(o),
                other => panic!("{other:?}"),
            },
            Err(e) => Err(e.0),
        }
    }

    const BASE_AUTH: &str = "auth: {disabled: true}\n";

    #[test]
    fn postgres_checks_certificates_by_default_and_needs_a_ca_for_it() {
        let e = postgres("{}").unwrap_err();
        assert!(
            e.starts_with("source.postgres.caFile:") && e.contains("verify-full"),
            "{e}"
        );
        assert_eq!(
            postgres("{caFile: /ca.pem}").unwrap(),
            PostgresOptions {
                ssl_mode: SslMode::VerifyFull,
                ca: Some(PostgresCa::File("/ca.pem".into())),
            }
        );
        assert_eq!(
            postgres("{caFile: system}").unwrap().ca,
            Some(PostgresCa::System)
        );
        let e = postgres("{sslMode: verify-ca}").unwrap_err();
        assert!(e.contains("caFile") && e.contains("verify-ca"), "{e}");
        let e = postgres("{sslMode: verify-ca, caFile: system}").unwrap_err();
        assert!(e.contains("caFile") && e.contains("verify-full"), "{e}");
        let e = postgres("{sslMode: require, caFile: system}").unwrap_err();
        assert!(e.contains("caFile"), "{e}");
        for weaker in ["disable", "prefer", "require"] {
            let o = postgres(&format!("{{sslMode: {weaker}}}")).unwrap();
            assert_eq!((o.ssl_mode.as_str(), o.ca), (weaker, None));
        }
    }
}
