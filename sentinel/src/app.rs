//! Wires the parts together: source → refresh loop → cache → HTTP server, plus auth, metrics,
//! the pool view and the scaling history, each started by a step of its own. [`start`] returns
//! a handle that stops everything; tests use [`start_with`] to plug in their own source and
//! listener.

use crate::backlog::cache::{BacklogCache, Snapshot};
use crate::backlog::refresh_loop::RefreshLoop;
use crate::config::file::{Config, WorkerConfig};
use crate::config::ConfigError;
use crate::history::clock::SystemClock;
use crate::history::instance::instance_name;
use crate::history::persist;
use crate::history::recorder::{HistoryRecorder, RecorderInputs};
use crate::history::store::{History, HistoryData};
use crate::kubernetes_client::{kube_client, review_client};
use crate::metrics::Metrics;
use crate::pool::cold_start::airflow_phases::AirflowPhases;
use crate::pool::{
    ClusterSource, ColdStarts, DeletionCostLoop, EdgeWorkerCensus, KubernetesPoolView,
    WorkloadWatch,
};
use crate::schedule::plan::Plan;
use crate::schedule::pre_warm::PreWarm;
use crate::schedule::reader::{PoolQueues, RestScheduleSource, ScheduleReader, ScheduleSource};
use crate::schedule::schedule_loop::ScheduleLoop;
use crate::schedule::windows::{PreWarmPool, Windows};
use crate::serve::api::{handle, AppState};
use crate::serve::auth::static_tokens::StaticTokens;
use crate::serve::auth::token_review::{ReviewCounters, TokenReviewer};
use crate::serve::auth::{Authenticator, Subscribers};
use crate::serve::external_scaler::server as external_scaler_server;
use crate::serve::external_scaler::service::ExternalScalerService;
use crate::serve::queue_events::QueueEvents;
use crate::sources::airflow_api::AirflowApiSource;
use crate::sources::postgres::PostgresSource;
use crate::sources::BacklogSource;
use http_server::Readiness;

use crate::config::file::{AuthConfig, HistoryConfig, TokenReviewConfig};
use crate::config::flags::{KubernetesAccess, Settings, SourceSettings};
use crate::config::queue_events::SubscriberAuthConfig;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::ServerTlsConfig;

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
    tasks: Tasks,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// What the external scaler port answers from.
    cache: Arc<BacklogCache>,
    workers: Vec<WorkerConfig>,
    staleness_limit: std::time::Duration,
    /// What the schedule reader publishes and the pre-warm windows read.
    schedule: ScheduleInputs,
}

/// What [`Running::read_schedule`] needs: the pre-warming pools, the cadence, the plan's
/// channel.
struct ScheduleInputs {
    pools: Vec<PoolQueues>,
    read_interval: std::time::Duration,
    plan: watch::Sender<Option<Arc<Plan>>>,
}

impl Running {
    /// The address the server listens on (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves KEDA's external scaler API on `listener` as well (with `tls` when set), from the
    /// same cache as `/v1`; returns its address.
    pub fn serve_external_scaler(
        &mut self,
        listener: TcpListener,
        tls: Option<ServerTlsConfig>,
    ) -> Result<SocketAddr, StartError> {
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::Runtime(format!("external scaler listener address: {e}")))?;
        let tls_enabled = tls.is_some();
        let service = ExternalScalerService::new(
            &self.workers,
            self.cache.clone(),
            self.staleness_limit,
            self.tasks.shutdown.clone(),
        );
        let task =
            external_scaler_server::spawn(listener, tls, service, self.tasks.shutdown.clone())?;
        self.tasks.handles.push(task);
        tracing::info!(%addr, tls = tls_enabled, "serving KEDA's external scaler API");
        Ok(addr)
    }

    /// Reads Airflow's schedule from `source` for the pre-warming workers (none: nothing to
    /// read) and pre-warms them from it.
    pub fn read_schedule(&mut self, source: Arc<dyn ScheduleSource>) {
        let s = &self.schedule;
        if s.pools.is_empty() {
            return;
        }
        tracing::info!(
            workers = s.pools.len(),
            read_interval = %humantime::format_duration(s.read_interval),
            "pre-warming from Airflow's schedule"
        );
        let schedule = ScheduleLoop {
            reader: ScheduleReader::new(source, s.pools.clone()),
            interval: s.read_interval,
            plan: s.plan.clone(),
        };
        self.tasks.spawn(schedule.run(self.tasks.shutdown.clone()));
    }

    /// Stops accepting, drains in-flight requests, stops the refresh loop.
    pub async fn stop(mut self) {
        self.tasks.shutdown.cancel();
        for task in std::mem::take(&mut self.tasks.handles) {
            let _ = task.await;
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

/// Builds the configured source and binds `settings.listen`.
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
            Some((listener, s.server_tls()?))
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
            running.read_schedule(Arc::new(RestScheduleSource {
                client: Arc::new(client),
                requests: metrics.upstream_requests.with_label_values(&["schedule"]),
            }));
        }
        SourceSettings::Postgres { .. } if !running.schedule.pools.is_empty() => {
            tracing::info!("no pre-warm: the schedule is read through Airflow's REST API, and the postgres source has no REST credentials");
        }
        SourceSettings::Postgres { .. } => {}
    }
    if let Some((listener, tls)) = external_scaler {
        if let Err(e) = running.serve_external_scaler(listener, tls) {
            running.stop().await;
            return Err(e);
        }
    }
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
    let auth = authenticator(&config.auth, kubernetes.as_ref(), &metrics, &mut tasks)?;
    let auth = match subscribers(
        &config.queue_events.auth,
        kubernetes.as_ref(),
        &metrics,
        &mut tasks,
    )? {
        Some(subscribers) if !config.auth.disabled => auth.with_subscribers(subscribers),
        _ => auth,
    };
    let queues = config.distinct_queues();
    let cache = Arc::new(BacklogCache::new(Snapshot::empty(&queues)));
    let readiness = Readiness::default();
    log_starting(&config, source.kind(), queues.len());
    let cold_starts = start_cold_starts(&config, &source, &metrics, &mut tasks);
    let history = start_history(
        &config.history,
        &config.workers,
        cold_starts.clone(),
        &mut tasks,
    )?;
    let pool = start_pool_view(
        &config,
        kubernetes.as_ref(),
        &source,
        &metrics,
        cold_starts.clone(),
        &mut tasks,
    )?;
    metrics.follow_cluster(pool.clone());
    let (schedule, pre_warm) = pre_warm(&config, pool.clone(), &history, cold_starts.clone());
    let refresh = RefreshLoop {
        source: source.clone(),
        queues,
        cache: cache.clone(),
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        interval: config.refresh_interval,
        staleness_limit: config.staleness_limit,
        history: history_recorder(&config, &history, pool, source.kind()),
        pre_warm: Some(pre_warm),
    };
    tasks.spawn(refresh.run(tasks.shutdown.clone()));
    let queue_events = QueueEvents::new(
        cache.clone(),
        config.queue_events.max_subscribers,
        metrics.queue_events.clone(),
        config.refresh_interval,
        config.staleness_limit,
        tasks.shutdown.clone(),
    );
    let state = AppState::new(
        config.workers.clone(),
        cache.clone(),
        config.staleness_limit,
        auth,
        metrics.clone(),
        readiness.clone(),
        history,
    )
    .with_queue_events(queue_events);
    let addr = serve_http(listener, state, &mut tasks)?;
    Ok(Running {
        addr,
        tasks,
        metrics,
        readiness,
        cache,
        workers: config.workers,
        staleness_limit: config.staleness_limit,
        schedule,
    })
}

/// The pre-warm windows of the workers with `preWarm.enabled` (the default), fed by a plan
/// that stays empty until [`Running::read_schedule`] starts reading it.
fn pre_warm(
    config: &Config,
    cluster: Arc<dyn ClusterSource>,
    history: &History,
    cold_starts: Arc<ColdStarts>,
) -> (ScheduleInputs, Arc<PreWarm>) {
    let windows = Windows::new(
        config
            .workers
            .iter()
            .map(|w| PreWarmPool {
                worker: w.clone(),
                config: config.schedule.for_worker(&w.name),
            })
            .collect(),
        Box::new(move |pool| cold_starts.typical_cold_start(pool)),
    );
    let (plan, plan_rx) = watch::channel(None);
    let inputs = ScheduleInputs {
        pools: windows
            .pools()
            .iter()
            .map(|p| PoolQueues::from(&p.worker))
            .collect(),
        read_interval: config.schedule.read_interval,
        plan,
    };
    let pre_warm = PreWarm {
        windows: Mutex::new(windows),
        plan: plan_rx,
        cluster,
        log: history.pre_warm_log(),
        staleness_limit: config.staleness_limit,
    };
    (inputs, Arc::new(pre_warm))
}

fn log_starting(config: &Config, source: &'static str, queues: usize) {
    tracing::info!(
        source,
        workers = config.workers.len(),
        queues,
        refresh_interval = %humantime::format_duration(config.refresh_interval),
        staleness_limit = %humantime::format_duration(config.staleness_limit),
        "starting"
    );
}

/// Who may read `/v1`: static tokens (watched for changes) and/or TokenReview, or anyone when
/// auth is disabled.
fn authenticator(
    auth: &AuthConfig,
    kubernetes: Option<&KubernetesAccess>,
    metrics: &Metrics,
    tasks: &mut Tasks,
) -> Result<Authenticator, StartError> {
    if auth.disabled {
        tracing::warn!("auth.disabled is true: /v1/workers answers anyone who can reach it");
        return Ok(Authenticator::disabled());
    }
    let static_tokens = match &auth.static_tokens_file {
        None => None,
        Some(path) => Some(static_tokens(path, "auth.staticTokensFile", tasks)?),
    };
    let token_review = match &auth.token_review {
        None => None,
        Some(tr) => Some(token_reviewer(tr, "auth.tokenReview", kubernetes, metrics)?),
    };
    Ok(Authenticator::new(static_tokens, token_review))
}

/// Who may open the queue-event stream besides the readers (`queueEvents.auth`), if anyone.
fn subscribers(
    auth: &SubscriberAuthConfig,
    kubernetes: Option<&KubernetesAccess>,
    metrics: &Metrics,
    tasks: &mut Tasks,
) -> Result<Option<Subscribers>, StartError> {
    if auth.static_tokens_file.is_none() && auth.token_review.is_none() {
        return Ok(None);
    }
    let static_tokens = match &auth.static_tokens_file {
        None => None,
        Some(path) => Some(static_tokens(
            path,
            "queueEvents.auth.staticTokensFile",
            tasks,
        )?),
    };
    let token_review = match &auth.token_review {
        None => None,
        Some(tr) => Some(token_reviewer(
            tr,
            "queueEvents.auth.tokenReview",
            kubernetes,
            metrics,
        )?),
    };
    Ok(Some(Subscribers {
        static_tokens,
        token_review,
    }))
}

/// The tokens in `path` (`key` in the file), kept up to date as the file changes.
fn static_tokens(
    path: &std::path::Path,
    key: &str,
    tasks: &mut Tasks,
) -> Result<Arc<StaticTokens>, StartError> {
    let tokens = StaticTokens::load(path)
        .map_err(|e| ConfigError::new(format!("{key}: cannot read {}: {e}", path.display())))?;
    if tokens.is_empty() {
        tracing::warn!(path = %path.display(), "the static tokens file holds no token");
    }
    let tokens = Arc::new(tokens);
    tasks.spawn(tokens.clone().watch(tasks.shutdown.clone()));
    Ok(tokens)
}

/// A TokenReview client for the `key` section.
fn token_reviewer(
    tr: &TokenReviewConfig,
    key: &str,
    kubernetes: Option<&KubernetesAccess>,
    metrics: &Metrics,
) -> Result<TokenReviewer, StartError> {
    let access = kubernetes.ok_or_else(|| {
        ConfigError::new(format!(
            "--kubernetes-api-url: {key} needs access to the Kubernetes API"
        ))
    })?;
    Ok(TokenReviewer::new(
        review_client(access).map_err(ConfigError::new)?,
        &tr.allowed_usernames,
        &tr.audiences,
        tr.cache_ttl,
        ReviewCounters {
            outcomes: metrics.token_reviews.clone(),
            skipped: metrics.token_reviews_skipped.clone(),
        },
    ))
}

/// The scaling history, loaded from `history.path` and kept saved there when it is set, with
/// the pools' cold starts (in memory only).
fn start_history(
    config: &HistoryConfig,
    workers: &[WorkerConfig],
    cold_starts: Arc<ColdStarts>,
    tasks: &mut Tasks,
) -> Result<Arc<History>, StartError> {
    let data = match &config.path {
        Some(path) => {
            let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
            if folder.is_some_and(|f| !f.is_dir()) {
                return Err(StartError::Config(ConfigError::new(format!(
                    "history.path: the folder of {} does not exist",
                    path.display()
                ))));
            }
            persist::load(path, workers)
        }
        None => HistoryData::default(),
    };
    let history = Arc::new(
        History::new(Arc::new(SystemClock), instance_name(), data).with_cold_starts(cold_starts),
    );
    if let Some(path) = &config.path {
        tasks.spawn(persist::keep_saved(
            history.clone(),
            path.clone(),
            tasks.shutdown.clone(),
        ));
    }
    Ok(history)
}

/// What the refresh loop hands the history after each refresh: every worker's answer and what
/// the pool view says of its workers.
fn history_recorder(
    config: &Config,
    history: &Arc<History>,
    pool: Arc<dyn ClusterSource>,
    backlog_source_kind: &'static str,
) -> HistoryRecorder {
    HistoryRecorder::new(
        history.clone(),
        RecorderInputs {
            workers: config.workers.clone(),
            cluster: pool,
            backlog_source_kind,
            refresh_interval: config.refresh_interval,
            staleness_limit: config.staleness_limit,
        },
    )
}

/// The tracker of every worker's cold start, and its look at Airflow for the phases only
/// Airflow knows (registration, first task).
fn start_cold_starts(
    config: &Config,
    source: &Arc<dyn BacklogSource>,
    metrics: &Metrics,
    tasks: &mut Tasks,
) -> Arc<ColdStarts> {
    let cold_starts = Arc::new(ColdStarts::new(
        config.workers.iter().map(|w| w.name.clone()),
        config.kubernetes.is_some(),
        Some(metrics.cold_starts.clone()),
    ));
    let phases = AirflowPhases {
        tracker: cold_starts.clone(),
        source: source.clone(),
        pools: config
            .workers
            .iter()
            .map(|w| (w.name.clone(), w.queues.clone()))
            .collect(),
        interval: config.refresh_interval,
    };
    tasks.spawn(phases.run(tasks.shutdown.clone()));
    cold_starts
}

/// With a kubernetes section, the watch of the worker Deployments and pods answers for the
/// pool view (and feeds the pod-deletion costs and the cold starts); otherwise Airflow's list
/// of Edge workers.
fn start_pool_view(
    config: &Config,
    kubernetes: Option<&KubernetesAccess>,
    source: &Arc<dyn BacklogSource>,
    metrics: &Metrics,
    cold_starts: Arc<ColdStarts>,
    tasks: &mut Tasks,
) -> Result<Arc<dyn ClusterSource>, StartError> {
    let workers: Vec<(String, Vec<String>)> = config
        .workers
        .iter()
        .map(|w| (w.name.clone(), w.queues.clone()))
        .collect();
    let Some(k8s) = &config.kubernetes else {
        let census = Arc::new(EdgeWorkerCensus::new(
            source.clone(),
            workers,
            config.refresh_interval,
            Some(cold_starts),
        ));
        tasks.spawn(census.clone().run(tasks.shutdown.clone()));
        return Ok(census);
    };
    let access = kubernetes.ok_or_else(|| {
        ConfigError::new(
            "--kubernetes-api-url: the kubernetes section needs access to the Kubernetes API",
        )
    })?;
    let client = kube_client(access).map_err(ConfigError::new)?;
    let watch = Arc::new(WorkloadWatch::start(
        client.clone(),
        &k8s.namespace,
        cold_starts,
        tasks.shutdown.clone(),
    ));
    tracing::info!(namespace = %k8s.namespace, idle_first_scale_in = k8s.idle_first_scale_in, "watching worker Deployments and pods");
    if k8s.idle_first_scale_in {
        let costs = DeletionCostLoop {
            source: source.clone(),
            watch: watch.clone(),
            pods: kube::Api::namespaced(client, &k8s.namespace),
            workers: workers.clone(),
            interval: config.refresh_interval,
            patches: metrics.pod_deletion_cost_patches.clone(),
        };
        tasks.spawn(costs.run(tasks.shutdown.clone()));
    }
    // The pods time the cold starts here: the census only reads the slots workers report.
    let census = Arc::new(EdgeWorkerCensus::new(
        source.clone(),
        workers,
        config.refresh_interval,
        None,
    ));
    tasks.spawn(census.clone().run(tasks.shutdown.clone()));
    Ok(Arc::new(KubernetesPoolView { watch, census }))
}

/// Serves `/v1`, `/metrics`, the probes and the page on `listener` until shutdown.
fn serve_http(
    listener: TcpListener,
    state: AppState,
    tasks: &mut Tasks,
) -> Result<SocketAddr, StartError> {
    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Runtime(format!("listener address: {e}")))?;
    let state = Arc::new(state);
    let handler = move |req| {
        let state = state.clone();
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
