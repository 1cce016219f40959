//! One configuration in force: everything that reads the workers, started together and
//! stopped together when the file changes (see [`Running`](super::Running)). What outlives a
//! change — the history, the cold starts, the metrics, the listening sockets — is [`Shared`].

use super::{StartError, Tasks};
use crate::backlog::cache::{BacklogCache, Snapshot};
use crate::backlog::refresh_loop::RefreshLoop;
use crate::config::file::{Config, TokenReviewConfig, WorkerConfig};
use crate::config::kubernetes_access::KubernetesAccess;
use crate::config::queue_events::SubscriberAuthConfig;
use crate::config::ConfigError;
use crate::history::recorder::{HistoryRecorder, RecorderInputs};
use crate::history::store::History;
use crate::kubernetes_client::{kube_client, review_client};
use crate::metrics::Metrics;
use crate::pool::cold_start::airflow_phases::AirflowPhases;
use crate::pool::{
    ClusterSource, ColdStarts, DeletionCostLoop, EdgeWorkerCensus, KubernetesPoolView, LeaderLease,
    WorkloadWatch,
};
use crate::schedule::plan::Plan;
use crate::schedule::pre_warm::PreWarm;
use crate::schedule::reader::{PoolQueues, ScheduleReader, ScheduleSource};
use crate::schedule::schedule_loop::ScheduleLoop;
use crate::schedule::windows::{PreWarmPool, Windows};
use crate::serve::api::AppState;
use crate::serve::auth::deployment_access::DeploymentAccess;
use crate::serve::auth::static_tokens::StaticTokens;
use crate::serve::auth::token_review::{ReviewCounters, TokenReviewer};
use crate::serve::auth::{Authenticator, Subscribers};
use crate::serve::external_scaler::certificates::Certificates;
use crate::serve::external_scaler::server as external_scaler_server;
use crate::serve::external_scaler::service::ExternalScalerService;
use crate::serve::queue_events::QueueEvents;
use crate::sources::BacklogSource;
use http_server::Readiness;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What every configuration uses and no change of it replaces.
pub(super) struct Shared {
    pub kubernetes: Option<KubernetesAccess>,
    pub source: Arc<dyn BacklogSource>,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    pub history: Arc<History>,
    pub cold_starts: Arc<ColdStarts>,
    /// KEDA's external scaler port, when served: each configuration serves it from a copy of
    /// the one listening socket, so a change never closes the port.
    pub external_scaler: Option<ExternalScalerPort>,
    /// Where the schedule is read for pre-warm, when it is.
    pub schedule_source: Option<Arc<dyn ScheduleSource>>,
}

pub(super) struct ExternalScalerPort {
    pub listener: std::net::TcpListener,
    /// Its TLS, when it has one; read again whenever the files change.
    pub certificates: Option<Arc<Certificates>>,
}

/// The tasks of one configuration and what the server answers from while it is in force.
pub(super) struct Generation {
    pub config: Config,
    pub cache: Arc<BacklogCache>,
    pub state: Arc<AppState>,
    tasks: Tasks,
    schedule: ScheduleInputs,
}

/// What [`Generation::read_schedule`] needs: the pre-warming pools, the cadence, the plan's
/// channel.
struct ScheduleInputs {
    pools: Vec<PoolQueues>,
    read_interval: std::time::Duration,
    plan: watch::Sender<Option<Arc<Plan>>>,
}

impl Generation {
    /// Starts the tasks of `config` under `parent`. `previous` is what the configuration it
    /// replaces had read: the queues that stay are served from it until the first refresh.
    pub fn start(
        config: Config,
        shared: &Shared,
        previous: Option<&Snapshot>,
        parent: &CancellationToken,
    ) -> Result<Generation, StartError> {
        let mut tasks = Tasks {
            shutdown: parent.child_token(),
            handles: Vec::new(),
        };
        let kubernetes = shared.kubernetes.as_ref();
        let metrics = &shared.metrics;
        let auth = authenticator(&config, kubernetes, metrics, &mut tasks)?;
        let auth = match subscribers(&config.queue_events.auth, kubernetes, metrics, &mut tasks)? {
            Some(subscribers) if !config.auth.disabled => auth.with_subscribers(subscribers),
            _ => auth,
        };
        let queues = config.distinct_queues();
        let snapshot = match previous {
            Some(previous) => Snapshot::keeping(previous, &queues),
            None => Snapshot::empty(&queues),
        };
        let cache = Arc::new(BacklogCache::new(snapshot));
        shared
            .cold_starts
            .follow(config.workers.iter().map(|w| w.name.clone()));
        follow_airflow_phases(&config, shared, &mut tasks);
        let pool = start_pool_view(&config, shared, &mut tasks)?;
        metrics.follow_cluster(pool.clone());
        let (schedule, pre_warm) = pre_warm(&config, pool.clone(), shared);
        let refresh = RefreshLoop {
            source: shared.source.clone(),
            queues,
            cache: cache.clone(),
            metrics: metrics.clone(),
            readiness: shared.readiness.clone(),
            interval: config.refresh_interval,
            staleness_limit: config.staleness_limit,
            held_tasks_interval: config.held_tasks_interval,
            history: history_recorder(&config, &shared.history, pool, shared.source.kind()),
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
            shared.readiness.clone(),
            shared.history.clone(),
        )
        .with_queue_events(queue_events)
        .with_hpa_scaled(config.hpa_scaled.clone());
        let mut generation = Generation {
            config,
            cache,
            state: Arc::new(state),
            tasks,
            schedule,
        };
        generation.serve_external_scaler(shared)?;
        generation.read_schedule(shared);
        Ok(generation)
    }

    /// Serves KEDA's external scaler API for the KEDA-scaled workers, if the port is served.
    pub fn serve_external_scaler(&mut self, shared: &Shared) -> Result<(), StartError> {
        let Some(port) = &shared.external_scaler else {
            return Ok(());
        };
        let listener = port
            .listener
            .try_clone()
            .and_then(TcpListener::from_std)
            .map_err(|e| StartError::Runtime(format!("external scaler listener: {e}")))?;
        let keda_scaled: Vec<WorkerConfig> = self
            .config
            .workers
            .iter()
            .filter(|w| !self.config.hpa_scaled.contains(&w.name))
            .cloned()
            .collect();
        let service = ExternalScalerService::new(
            &keda_scaled,
            self.cache.clone(),
            self.config.staleness_limit,
            self.tasks.shutdown.clone(),
        );
        let task = external_scaler_server::spawn(
            listener,
            port.certificates.clone(),
            service,
            self.tasks.shutdown.clone(),
        );
        self.tasks.handles.push(task);
        Ok(())
    }

    /// Reads Airflow's schedule for the pre-warming workers (none: nothing to read), if a
    /// schedule source is set.
    pub fn read_schedule(&mut self, shared: &Shared) {
        let (Some(source), s) = (&shared.schedule_source, &self.schedule) else {
            return;
        };
        if s.pools.is_empty() {
            return;
        }
        tracing::info!(
            workers = s.pools.len(),
            read_interval = %humantime::format_duration(s.read_interval),
            "pre-warming from Airflow's schedule"
        );
        let schedule = ScheduleLoop {
            reader: ScheduleReader::new(source.clone(), s.pools.clone()),
            interval: s.read_interval,
            plan: s.plan.clone(),
        };
        self.tasks.spawn(schedule.run(self.tasks.shutdown.clone()));
    }

    /// Whether any worker pre-warms from the schedule.
    pub fn pre_warms(&self) -> bool {
        !self.schedule.pools.is_empty()
    }

    /// Stops every task of this configuration and waits for them.
    pub async fn stop(&mut self) {
        self.tasks.shutdown.cancel();
        for task in std::mem::take(&mut self.tasks.handles) {
            let _ = task.await;
        }
    }
}

/// The pre-warm windows of the workers with `preWarm.enabled` (the default), fed by a plan
/// that stays empty until [`Generation::read_schedule`] starts reading it.
fn pre_warm(
    config: &Config,
    cluster: Arc<dyn ClusterSource>,
    shared: &Shared,
) -> (ScheduleInputs, Arc<PreWarm>) {
    let cold_starts = shared.cold_starts.clone();
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
        log: shared.history.pre_warm_log(),
        staleness_limit: config.staleness_limit,
    };
    (inputs, Arc::new(pre_warm))
}

/// Who may read `/v1`: static tokens (watched for changes) and/or TokenReview, or anyone when
/// auth is disabled.
fn authenticator(
    config: &Config,
    kubernetes: Option<&KubernetesAccess>,
    metrics: &Metrics,
    tasks: &mut Tasks,
) -> Result<Authenticator, StartError> {
    let auth = &config.auth;
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
    let authenticator = Authenticator::new(static_tokens, token_review);
    let (Some(ttl), Some(k8s)) = (auth.kubernetes_users, &config.kubernetes) else {
        return Ok(authenticator);
    };
    let access = kubernetes.ok_or_else(|| {
        ConfigError::new(
            "--kubernetes-api-url: auth.kubernetesUsers needs access to the Kubernetes API",
        )
    })?;
    Ok(authenticator.with_deployment_access(DeploymentAccess::new(
        review_client(access).map_err(ConfigError::new)?,
        k8s.namespace.clone(),
        ttl,
        metrics.access_reviews.clone(),
    )))
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

/// The cold starts' look at Airflow for the phases only Airflow knows (registration, first
/// task).
fn follow_airflow_phases(config: &Config, shared: &Shared, tasks: &mut Tasks) {
    let phases = AirflowPhases {
        tracker: shared.cold_starts.clone(),
        source: shared.source.clone(),
        pools: config
            .workers
            .iter()
            .map(|w| (w.name.clone(), w.queues.clone()))
            .collect(),
        interval: config.refresh_interval,
    };
    tasks.spawn(phases.run(tasks.shutdown.clone()));
}

/// With a kubernetes section, the watch of the worker Deployments and pods answers for the
/// pool view (and feeds the pod-deletion costs and the cold starts); otherwise Airflow's list
/// of Edge workers.
fn start_pool_view(
    config: &Config,
    shared: &Shared,
    tasks: &mut Tasks,
) -> Result<Arc<dyn ClusterSource>, StartError> {
    let workers: Vec<(String, Vec<String>)> = config
        .workers
        .iter()
        .map(|w| (w.name.clone(), w.queues.clone()))
        .collect();
    let Some(k8s) = &config.kubernetes else {
        let census = Arc::new(EdgeWorkerCensus::new(
            shared.source.clone(),
            workers,
            config.refresh_interval,
            Some(shared.cold_starts.clone()),
        ));
        tasks.spawn(census.clone().run(tasks.shutdown.clone()));
        return Ok(census);
    };
    let access = shared.kubernetes.as_ref().ok_or_else(|| {
        ConfigError::new(
            "--kubernetes-api-url: the kubernetes section needs access to the Kubernetes API",
        )
    })?;
    let client = kube_client(access).map_err(ConfigError::new)?;
    let watch = Arc::new(WorkloadWatch::start(
        client.clone(),
        &k8s.namespace,
        &k8s.worker_labels,
        shared.cold_starts.clone(),
        shared.metrics.watch_cached_objects.clone(),
        tasks.shutdown.clone(),
    ));
    tracing::info!(namespace = %k8s.namespace, worker_labels = ?k8s.worker_labels, idle_first_scale_in = k8s.idle_first_scale_in, "watching worker Deployments and pods");
    if k8s.idle_first_scale_in {
        let costs = DeletionCostLoop {
            source: shared.source.clone(),
            watch: watch.clone(),
            pods: kube::Api::namespaced(client.clone(), &k8s.namespace),
            workers: workers.clone(),
            interval: config.refresh_interval,
            patches: shared.metrics.pod_deletion_cost_patches.clone(),
            leader: k8s.deletion_cost_lease.as_deref().map(|name| {
                LeaderLease::new(kube::Api::namespaced(client.clone(), &k8s.namespace), name)
            }),
            leading: shared.metrics.deletion_cost_leader.clone(),
        };
        tasks.spawn(costs.run(tasks.shutdown.clone()));
    }
    // The pods time the cold starts here: the census only reads the slots workers report.
    let census = Arc::new(EdgeWorkerCensus::new(
        shared.source.clone(),
        workers,
        config.refresh_interval,
        None,
    ));
    tasks.spawn(census.clone().run(tasks.shutdown.clone()));
    Ok(Arc::new(KubernetesPoolView { watch, census }))
}
