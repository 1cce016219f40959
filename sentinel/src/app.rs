//! Wires the parts together: source → refresh loop → cache → HTTP server, plus auth, metrics
//! and the scaling history. [`start`] returns a handle that stops everything; tests use
//! [`start_with`] to plug in their own source and listener.

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
use crate::pool::ClusterSource;
use crate::pool::{DeletionCostLoop, EdgeWorkerCensus, WorkloadWatch};
use crate::serve::api::{handle, AppState};
use crate::serve::auth::static_tokens::StaticTokens;
use crate::serve::auth::token_review::{ReviewCounters, TokenReviewer};
use crate::serve::auth::Authenticator;
use crate::serve::external_scaler::server as external_scaler_server;
use crate::serve::external_scaler::service::ExternalScalerService;
use crate::sources::airflow_api::AirflowApiSource;
use crate::sources::postgres::PostgresSource;
use crate::sources::BacklogSource;
use http_server::Readiness;

use crate::config::flags::{KubernetesAccess, Settings, SourceSettings};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
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
    shutdown: CancellationToken,
    /// A handle dropped without [`Running::stop`] (a test that ends) still stops every task.
    _stop_on_drop: DropGuard,
    tasks: Vec<JoinHandle<()>>,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// What the external scaler port answers from.
    cache: Arc<BacklogCache>,
    workers: Vec<WorkerConfig>,
    staleness_limit: std::time::Duration,
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
            self.shutdown.clone(),
        );
        let task = external_scaler_server::spawn(listener, tls, service, self.shutdown.clone())?;
        self.tasks.push(task);
        tracing::info!(%addr, tls = tls_enabled, "serving KEDA's external scaler API");
        Ok(addr)
    }

    /// Stops accepting, drains in-flight requests, stops the refresh loop.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
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
        metrics,
        listener,
    )
    .await?;
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
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();

    let auth = if config.auth.disabled {
        tracing::warn!("auth.disabled is true: /v1/workers answers anyone who can reach it");
        Authenticator::disabled()
    } else {
        let static_tokens = match &config.auth.static_tokens_file {
            None => None,
            Some(path) => {
                let tokens = StaticTokens::load(path).map_err(|e| {
                    ConfigError::new(format!(
                        "auth.staticTokensFile: cannot read {}: {e}",
                        path.display()
                    ))
                })?;
                if tokens.is_empty() {
                    tracing::warn!(path = %path.display(), "the static tokens file holds no token");
                }
                let tokens = Arc::new(tokens);
                tasks.push(tokio::spawn(tokens.clone().watch(shutdown.clone())));
                Some(tokens)
            }
        };
        let token_review = match (&config.auth.token_review, &kubernetes) {
            (Some(tr), Some(access)) => Some(TokenReviewer::new(
                review_client(access).map_err(ConfigError::new)?,
                &tr.allowed_usernames,
                &tr.audiences,
                tr.cache_ttl,
                ReviewCounters {
                    outcomes: metrics.token_reviews.clone(),
                    skipped: metrics.token_reviews_skipped.clone(),
                },
            )),
            (Some(_), None) => {
                return Err(StartError::Config(ConfigError::new(
                    "--kubernetes-api-url: auth.tokenReview needs access to the Kubernetes API",
                )))
            }
            (None, _) => None,
        };
        Authenticator::new(static_tokens, token_review)
    };

    let queues = config.distinct_queues();
    let cache = Arc::new(BacklogCache::new(Snapshot::empty(&queues)));
    let readiness = Readiness::default();
    tracing::info!(
        source = source.kind(),
        workers = config.workers.len(),
        queues = queues.len(),
        refresh_interval = %humantime::format_duration(config.refresh_interval),
        staleness_limit = %humantime::format_duration(config.staleness_limit),
        "starting"
    );
    let history_data = match &config.history.path {
        Some(path) => {
            let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
            if folder.is_some_and(|f| !f.is_dir()) {
                return Err(StartError::Config(ConfigError::new(format!(
                    "history.path: the folder of {} does not exist",
                    path.display()
                ))));
            }
            persist::load(path, &config.workers)
        }
        None => HistoryData::default(),
    };
    let history = Arc::new(History::new(
        Arc::new(SystemClock),
        instance_name(),
        history_data,
    ));
    if let Some(path) = &config.history.path {
        tasks.push(tokio::spawn(persist::keep_saved(
            history.clone(),
            path.clone(),
            shutdown.clone(),
        )));
    }
    let workers: Vec<(String, Vec<String>)> = config
        .workers
        .iter()
        .map(|w| (w.name.clone(), w.queues.clone()))
        .collect();
    // With a kubernetes section, the watch of the worker Deployments and pods answers for the
    // history (and feeds the pod-deletion costs); otherwise Airflow's list of Edge workers.
    let cluster: Arc<dyn ClusterSource> = if let Some(k8s) = &config.kubernetes {
        let access = kubernetes.as_ref().ok_or_else(|| {
            ConfigError::new(
                "--kubernetes-api-url: the kubernetes section needs access to the Kubernetes API",
            )
        })?;
        let client = kube_client(access).map_err(ConfigError::new)?;
        let watch = Arc::new(WorkloadWatch::start(
            client.clone(),
            &k8s.namespace,
            shutdown.clone(),
        ));
        tracing::info!(namespace = %k8s.namespace, idle_first_scale_in = k8s.idle_first_scale_in, "watching worker Deployments and pods");
        if k8s.idle_first_scale_in {
            let costs = DeletionCostLoop {
                source: source.clone(),
                watch: watch.clone(),
                pods: kube::Api::namespaced(client, &k8s.namespace),
                workers,
                interval: config.refresh_interval,
                patches: metrics.pod_deletion_cost_patches.clone(),
            };
            tasks.push(tokio::spawn(costs.run(shutdown.clone())));
        }
        watch
    } else {
        let census = Arc::new(EdgeWorkerCensus::new(
            source.clone(),
            workers,
            config.refresh_interval,
        ));
        tasks.push(tokio::spawn(census.clone().run(shutdown.clone())));
        census
    };

    metrics.follow_cluster(cluster.clone());
    let recorder = HistoryRecorder::new(
        history.clone(),
        RecorderInputs {
            workers: config.workers.clone(),
            cluster,
            backlog_source_kind: source.kind(),
            refresh_interval: config.refresh_interval,
            staleness_limit: config.staleness_limit,
        },
    );
    let refresh = RefreshLoop {
        source: source.clone(),
        queues,
        cache: cache.clone(),
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        interval: config.refresh_interval,
        staleness_limit: config.staleness_limit,
        history: recorder,
    };
    tasks.push(tokio::spawn(refresh.run(shutdown.clone())));

    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Runtime(format!("listener address: {e}")))?;
    let workers = config.workers.clone();
    let state = Arc::new(AppState::new(
        config.workers,
        cache.clone(),
        config.staleness_limit,
        auth,
        metrics.clone(),
        readiness.clone(),
        history,
    ));
    let handler = move |req| {
        let state = state.clone();
        async move { handle(&state, req).await }
    };
    tasks.push(tokio::spawn(http_server::serve(
        listener,
        http_server::Limits::default(),
        handler,
        shutdown.clone().cancelled_owned(),
    )));
    tracing::info!(%addr, "listening");

    Ok(Running {
        addr,
        _stop_on_drop: shutdown.clone().drop_guard(),
        shutdown,
        tasks,
        metrics,
        readiness,
        cache,
        workers,
        staleness_limit: config.staleness_limit,
    })
}
