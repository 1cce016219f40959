//! Wires the parts together: source → refresh loop → cache → HTTP server, plus auth, metrics,
//! the pool view and the scaling history. [`start`] returns a handle that stops everything;
//! tests use [`start_with`] to plug in their own source and listener.
//!
//! A change of the configuration file is applied without a restart: what reads the workers
//! is one `Generation`, started anew from the new file and swapped in once running, while
//! what outlives it (`Shared`: the history, the cold starts, the metrics, the listening
//! sockets) stays. An invalid file is refused (logged, counted) and the running one kept.

mod generation;

use crate::config::file::{Config, HistoryConfig, WorkerConfig};
use crate::config::flags::{Settings, SourceSettings};
use crate::config::kubernetes_access::KubernetesAccess;
use crate::config::reload::{keep_fixed_settings, ConfigFileWatch};
use crate::config::ConfigError;
use crate::history::clock::{unix_ms, SystemClock, WallClock};
use crate::history::file_lock::{self, HistoryFileLock};
use crate::history::instance::instance_name;
use crate::history::persist;
use crate::history::store::{History, HistoryData, HistoryKept};
use crate::metrics::Metrics;
use crate::pool::ColdStarts;
use crate::schedule::reader::{RestScheduleSource, ScheduleSource};
use crate::serve::api::{handle, AppState};
use crate::serve::external_scaler::certificates::Certificates;
use crate::sources::airflow_api::AirflowApiSource;
use crate::sources::postgres::PostgresSource;
use crate::sources::BacklogSource;
use generation::{ExternalScalerPort, Generation, Shared};
use http_server::Readiness;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why the Sentinel could not start: bad configuration (exit 2) or anything else (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Runtime(String),
}

/// A started Sentinel.
pub struct Running {
    addr: SocketAddr,
    /// What lives as long as the process: the HTTP server, the history file, the file watch.
    tasks: Tasks,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    pipeline: Arc<tokio::sync::Mutex<Pipeline>>,
}

/// The configuration in force and what a new one is started with.
struct Pipeline {
    shared: Shared,
    current: Generation,
    /// What the HTTP server answers from: the current generation's state.
    state: watch::Sender<Arc<AppState>>,
    /// The parent of every generation's tasks.
    root: CancellationToken,
}

impl Running {
    /// The address the server listens on (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves KEDA's external scaler API on `listener` as well (over TLS with `certificates`
    /// when set, their files checked for changes every `check_interval`), from the same cache
    /// as `/v1`, for every configuration from now on; returns its address.
    pub async fn serve_external_scaler(
        &mut self,
        listener: TcpListener,
        certificates: Option<Certificates>,
        check_interval: Duration,
    ) -> Result<SocketAddr, StartError> {
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::Runtime(format!("external scaler listener address: {e}")))?;
        let listener = listener
            .into_std()
            .map_err(|e| StartError::Runtime(format!("external scaler listener: {e}")))?;
        let certificates = certificates.map(Arc::new);
        if let Some(certificates) = &certificates {
            let reloads = self.metrics.external_scaler_certificate_reloads.clone();
            let follow =
                certificates
                    .clone()
                    .follow(check_interval, reloads, self.tasks.shutdown.clone());
            self.tasks.spawn(follow);
        }
        let tls_enabled = certificates.is_some();
        let mut pipeline = self.pipeline.lock().await;
        let Pipeline {
            shared, current, ..
        } = &mut *pipeline;
        shared.external_scaler = Some(ExternalScalerPort {
            listener,
            certificates,
        });
        current.serve_external_scaler(shared)?;
        tracing::info!(%addr, tls = tls_enabled, "serving KEDA's external scaler API");
        Ok(addr)
    }

    /// Reads Airflow's schedule from `source` for the pre-warming workers (none: nothing to
    /// read) and pre-warms them from it, for every configuration from now on.
    pub async fn read_schedule(&mut self, source: Arc<dyn ScheduleSource>) {
        let mut pipeline = self.pipeline.lock().await;
        let Pipeline {
            shared, current, ..
        } = &mut *pipeline;
        shared.schedule_source = Some(source);
        current.read_schedule(shared);
    }

    /// Applies each change of the configuration file at `path`, checked every `interval`.
    pub fn watch_config(&mut self, path: PathBuf, interval: Duration) {
        let (changes, mut received) = mpsc::channel(1);
        let watch = ConfigFileWatch::new(path.clone(), interval);
        self.tasks
            .spawn(watch.run(changes, self.tasks.shutdown.clone()));
        let pipeline = self.pipeline.clone();
        let metrics = self.metrics.clone();
        self.tasks.spawn(async move {
            while let Some(change) = received.recv().await {
                let applied = match change {
                    Ok(next) => pipeline.lock().await.apply(next).await,
                    Err(e) => Err(StartError::Config(e)),
                };
                match applied {
                    Ok(generation) => metrics.config_generation.set(generation),
                    Err(error) => {
                        metrics.config_reload_failures.inc();
                        tracing::error!(path = %path.display(), %error, "configuration change refused; keeping the running configuration");
                    }
                }
            }
        });
        tracing::info!(interval = %humantime::format_duration(interval), "applying changes of the configuration file as they come");
    }

    /// Stops accepting, drains in-flight requests, stops the refresh loop.
    pub async fn stop(mut self) {
        self.tasks.shutdown.cancel();
        for task in std::mem::take(&mut self.tasks.handles) {
            let _ = task.await;
        }
        // Nothing starts a generation any more: the watch above has stopped.
        self.pipeline.lock().await.current.stop().await;
    }
}

impl Pipeline {
    /// Starts `next` (its fixed settings kept from the running one), serves from it, then
    /// stops the one it replaces; returns the new generation's number.
    async fn apply(&mut self, next: Config) -> Result<i64, StartError> {
        let next = keep_fixed_settings(&self.current.config, next);
        let changes = WorkerChanges::between(&self.current.config.workers, &next.workers);
        let previous = self.current.cache.snapshot();
        let generation = Generation::start(next, &self.shared, Some(&previous), &self.root)?;
        self.state.send_replace(generation.state.clone());
        let mut replaced = std::mem::replace(&mut self.current, generation);
        replaced.stop().await;
        let number = self.shared.metrics.config_generation.get() + 1;
        tracing::info!(
            generation = number,
            added = ?changes.added,
            removed = ?changes.removed,
            changed = ?changes.changed,
            "configuration change applied; the history of the workers that stay is kept"
        );
        Ok(number)
    }
}

/// Which workers a configuration change adds, removes or edits (for the log).
struct WorkerChanges {
    added: Vec<String>,
    removed: Vec<String>,
    changed: Vec<String>,
}

impl WorkerChanges {
    fn between(running: &[WorkerConfig], next: &[WorkerConfig]) -> WorkerChanges {
        let find =
            |list: &[WorkerConfig], name: &str| list.iter().find(|w| w.name == name).cloned();
        WorkerChanges {
            added: next
                .iter()
                .filter(|w| find(running, &w.name).is_none())
                .map(|w| w.name.clone())
                .collect(),
            removed: running
                .iter()
                .filter(|w| find(next, &w.name).is_none())
                .map(|w| w.name.clone())
                .collect(),
            changed: next
                .iter()
                .filter(|w| find(running, &w.name).is_some_and(|r| &r != *w))
                .map(|w| w.name.clone())
                .collect(),
        }
    }
}

/// The Sentinel's tasks and the token that stops them all. Dropped without
/// [`Running::stop`] — a start that fails half-way, a test that ends — it still stops them.
struct Tasks {
    shutdown: CancellationToken,
    handles: Vec<JoinHandle<()>>,
}

impl Tasks {
    fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.handles.push(tokio::spawn(task));
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Builds the configured source, binds `settings.listen` and follows the configuration file.
pub async fn start(settings: Settings) -> Result<Running, StartError> {
    let metrics = Arc::new(Metrics::new());
    let source = build_source(&settings.source, &metrics)?;
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| StartError::Runtime(format!("cannot listen on {}: {e}", settings.listen)))?;
    // Read the TLS files before anything starts: a bad file is a configuration error.
    let external_scaler = match &settings.external_scaler {
        Some(s) => {
            let listener = TcpListener::bind(s.listen)
                .await
                .map_err(|e| StartError::Runtime(format!("cannot listen on {}: {e}", s.listen)))?;
            Some((listener, s.certificates()?))
        }
        None => None,
    };
    let mut running = start_with(
        settings.config,
        settings.kubernetes,
        source,
        metrics.clone(),
        listener,
    )
    .await?;
    match &settings.source {
        SourceSettings::AirflowApi {
            url,
            credentials,
            ca,
        } => {
            let client = airflow::rest_api::RestApiClient::new(
                url,
                credentials.clone(),
                concat!("astro-sentinel/", env!("CARGO_PKG_VERSION")),
                ca.as_ref(),
            )
            .map_err(|e| StartError::Runtime(format!("cannot build the REST API client: {e}")))?;
            running
                .read_schedule(Arc::new(RestScheduleSource {
                    client: Arc::new(client),
                    requests: metrics.upstream_requests.with_label_values(&["schedule"]),
                }))
                .await;
        }
        SourceSettings::Postgres { .. } if running.pipeline.lock().await.current.pre_warms() => {
            tracing::info!("no pre-warm: the schedule is read through Airflow's REST API, and the postgres source has no REST credentials");
        }
        SourceSettings::Postgres { .. } => {}
    }
    if let Some((listener, certificates)) = external_scaler {
        let check_interval = settings.config_check_interval;
        let served = running
            .serve_external_scaler(listener, certificates, check_interval)
            .await;
        if let Err(e) = served {
            running.stop().await;
            return Err(e);
        }
    }
    running.watch_config(settings.config_path, settings.config_check_interval);
    Ok(running)
}

pub fn build_source(
    source: &SourceSettings,
    metrics: &Metrics,
) -> Result<Arc<dyn BacklogSource>, StartError> {
    match source {
        SourceSettings::AirflowApi {
            url,
            credentials,
            ca,
        } => {
            let requests = metrics
                .upstream_requests
                .with_label_values(&["airflow-api"]);
            let s = AirflowApiSource::new(url, credentials.clone(), requests, ca.as_ref())
                .map_err(StartError::Runtime)?;
            Ok(Arc::new(s))
        }
        SourceSettings::Postgres {
            connection,
            options,
        } => {
            let queries = metrics.upstream_requests.with_label_values(&["postgres"]);
            let s = PostgresSource::new(connection.clone(), options, queries)
                .map_err(|e| StartError::Config(ConfigError::new(e)))?;
            Ok(Arc::new(s))
        }
    }
}

/// Starts the Sentinel on `listener` with `source`. The history learns about the workers' pods
/// from the Kubernetes API when the configuration has a `kubernetes` section, otherwise from
/// Airflow's list of Edge workers.
pub async fn start_with(
    config: Config,
    kubernetes: Option<KubernetesAccess>,
    source: Arc<dyn BacklogSource>,
    metrics: Arc<Metrics>,
    listener: TcpListener,
) -> Result<Running, StartError> {
    let mut tasks = Tasks {
        shutdown: CancellationToken::new(),
        handles: Vec::new(),
    };
    let source_kind = source.kind();
    let cold_starts = Arc::new(ColdStarts::new(
        config.workers.iter().map(|w| w.name.clone()),
        config.kubernetes.is_some(),
        Some(metrics.cold_starts.clone()),
    ));
    let (history, history_lock) =
        start_history(&config.history, &config.workers, cold_starts.clone())?;
    let shared = Shared {
        kubernetes,
        source,
        metrics: metrics.clone(),
        readiness: Readiness::default(),
        history: history.clone(),
        cold_starts,
        external_scaler: None,
        schedule_source: None,
    };
    let history_path = config.history.path.clone();
    let current = Generation::start(config, &shared, None, &tasks.shutdown)?;
    // Logged once the configuration has proved usable: an invalid one gets one line only.
    log_starting(&current.config, source_kind);
    metrics.config_generation.set(1);
    let (state, state_rx) = watch::channel(current.state.clone());
    if let Some(path) = history_path {
        // Said before /metrics serves: the writer task may first run after the first scrape.
        metrics
            .history_file_owner
            .set(i64::from(history_lock.is_some()));
        let configured = state_rx.clone();
        tasks.spawn(file_lock::write_when_free(
            history,
            path,
            history_lock,
            move || configured.borrow().workers().to_vec(),
            metrics.history_file_owner.clone(),
            tasks.shutdown.clone(),
        ));
    }
    let addr = serve_http(listener, state_rx, &mut tasks)?;
    let readiness = shared.readiness.clone();
    let pipeline = Pipeline {
        shared,
        current,
        state,
        root: tasks.shutdown.clone(),
    };
    Ok(Running {
        addr,
        tasks,
        metrics,
        readiness,
        pipeline: Arc::new(tokio::sync::Mutex::new(pipeline)),
    })
}

fn log_starting(config: &Config, source: &'static str) {
    tracing::info!(
        source,
        workers = config.workers.len(),
        queues = config.distinct_queues().len(),
        refresh_interval = %humantime::format_duration(config.refresh_interval),
        staleness_limit = %humantime::format_duration(config.staleness_limit),
        "starting"
    );
}

/// The scaling history, with the pools' cold starts (in memory only). With `history.path`,
/// loaded from the file when this replica can take its lock (returned, for the writer);
/// otherwise another replica writes the file and this one starts in memory.
fn start_history(
    config: &HistoryConfig,
    workers: &[WorkerConfig],
    cold_starts: Arc<ColdStarts>,
) -> Result<(Arc<History>, Option<HistoryFileLock>), StartError> {
    let (data, lock) = match &config.path {
        Some(path) => {
            let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
            if folder.is_some_and(|f| !f.is_dir()) {
                return Err(StartError::Config(ConfigError::new(format!(
                    "history.path: the folder of {} does not exist",
                    path.display()
                ))));
            }
            let lock = HistoryFileLock::try_acquire(path).map_err(|e| {
                ConfigError::new(format!(
                    "history.path: cannot create the lock file beside {}: {e}",
                    path.display()
                ))
            })?;
            match lock {
                Some(lock) => (
                    persist::load(path, workers, unix_ms(SystemClock.now())),
                    Some(lock),
                ),
                None => (HistoryData::default(), None),
            }
        }
        None => (HistoryData::default(), None),
    };
    if config.volatile {
        tracing::warn!("history.volatile: the history file lies in the Pod's own volume and is lost when the Pod goes; give it a volume that outlives the Pod to keep it");
    }
    let history = History::new(Arc::new(SystemClock), instance_name(), data)
        .with_cold_starts(cold_starts)
        .kept_in(HistoryKept::of(config));
    Ok((Arc::new(history), lock))
}

/// Serves `/v1`, `/metrics`, the probes and the page on `listener` until shutdown, each
/// request from the configuration in force when it arrives.
fn serve_http(
    listener: TcpListener,
    state: watch::Receiver<Arc<AppState>>,
    tasks: &mut Tasks,
) -> Result<SocketAddr, StartError> {
    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Runtime(format!("listener address: {e}")))?;
    let handler = move |req| {
        let state = state.borrow().clone();
        async move { handle(&state, req).await }
    };
    tasks.spawn(http_server::serve(
        listener,
        http_server::Limits::default(),
        handler,
        tasks.shutdown.clone().cancelled_owned(),
    ));
    tracing::info!(%addr, "listening");
    Ok(addr)
}
