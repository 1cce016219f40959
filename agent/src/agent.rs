//! The agent's life: register, run the loops, drain, report offline.

use crate::admin_server;
use crate::config::Config;
use crate::context::Context;
use crate::fetch_loop;
use crate::heartbeat;
use crate::metrics::{EdgeCallMetrics, Metrics};
use crate::queue_stats;
use crate::registration::{self, Registered};
use crate::sentinel_subscription;
use crate::settings_drift::SettingsDrift;
use crate::shutdown;
use crate::slots::Slots;
use crate::task_host_client::{LeftBehind, TaskHost, Welcome};
use crate::task_host_link::Link;
use crate::task_host_protocol::TaskSettings;
use crate::task_runner;
use crate::versions;
use crate::wake::Wake;
use crate::worker_status::WorkerStatus;
use airflow::edge_client::EdgeClient;
use airflow::edge_token::EdgeTokenSigner;
use airflow::edge_types::EdgeJob;
use anyhow::Context as _;
use http_server::Readiness;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// `task_env` is the environment a task host the agent starts gets (see [`crate::task_env`]);
/// `log_format` is the agent's, passed on to it.
pub async fn run(
    config: Config,
    task_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    log_format: String,
) -> anyhow::Result<()> {
    let slots = Slots::new(config.sync_slots);
    let metrics = Arc::new(Metrics::new(slots.clone()));
    let readiness = Readiness::default();
    let drain = CancellationToken::new();
    let kill = CancellationToken::new();
    shutdown::watch(drain.clone(), kill.clone()).context("installing signal handlers")?;

    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("--listen {}: cannot listen", config.listen))?;
    let stop_admin = CancellationToken::new();
    let admin = tokio::spawn(admin_server::serve(
        listener,
        metrics.clone(),
        readiness.clone(),
        config.admin_connections,
        stop_admin.clone(),
    ));
    // An async block, so that every way out of it (`?` included) still stops the admin server.
    let outcome: anyhow::Result<()> = async {
        let edge = EdgeClient::new(
            &config.api_url,
            EdgeTokenSigner::new(config.jwt_secret.expose()),
            Box::new(EdgeCallMetrics(metrics.clone())),
            config.ca.as_ref(),
        )
        .context("building the HTTP client")?;
        let settings = TaskSettings {
            python: config.python.clone(),
            execution_api_url: config.execution_api_url.to_string(),
            worker_name: config.worker_name.clone(),
            log_folder: config.log_folder.clone(),
            mode: config.launch_mode,
            slots: config.sync_slots,
            task_env_allow: config
                .task_env_allow
                .iter()
                .map(|p| p.as_str().to_string())
                .collect(),
        };
        let link = match &config.task_host_socket {
            Some(socket) => Link::Socket(socket.clone()),
            None => Link::Child {
                program: std::env::current_exe()
                    .context("finding the agent's own binary to start the task host")?,
                env: task_env,
                log_format,
            },
        };
        // The task host's launcher imports Airflow (seconds) while the worker registers.
        let stop_host = CancellationToken::new();
        let (task_host, welcome, adopt) = tokio::select! {
            started = TaskHost::start(settings, link, stop_host.clone()) => started?,
            _ = drain.cancelled() => {
                tracing::info!("stopped before the task host answered");
                return Ok(());
            }
        };
        let Welcome {
            versions,
            left_behind,
        } = welcome;
        let versions = versions::resolve(
            &versions,
            config.airflow_version.clone(),
            config.edge_provider_version.clone(),
        );
        let ctx = Arc::new(Context {
            slots,
            status: WorkerStatus::new(config.queues.clone(), versions),
            drift: SettingsDrift::new(
                config.sync_slots,
                config.queues.clone(),
                metrics.settings_overridden.clone(),
            ),
            config,
            edge,
            metrics,
            task_host,
            jobs: TaskTracker::new(),
            drain,
            kill,
            give_up: CancellationToken::new(),
            heartbeat_now: Notify::new(),
            maintenance_changed: Notify::new(),
            wake: Wake::default(),
        });
        let outcome = serve(&ctx, &readiness, left_behind, adopt).await;
        stop_host.cancel();
        outcome
    }
    .await;
    stop_admin.cancel();
    let _ = admin.await;
    outcome
}

async fn serve(
    ctx: &Arc<Context>,
    readiness: &Readiness,
    left_behind: Vec<LeftBehind>,
    mut adopt: tokio::sync::mpsc::UnboundedReceiver<LeftBehind>,
) -> anyhow::Result<()> {
    if let Registered::Abandoned = registration::register(ctx).await? {
        tracing::info!("stopped before registration completed");
        return Ok(());
    }
    for task in left_behind {
        take_over(ctx, task).await;
    }
    // Tasks a reconnection finds that this agent never started (a task host that outlived
    // two agents' connections).
    let adopting = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while let Some(task) = adopt.recv().await {
                take_over(&ctx, task).await;
            }
        })
    };
    // Ready: registered with Airflow, until the drain begins.
    readiness.set(true);
    let stop_background = CancellationToken::new();
    let heartbeats = tokio::spawn(heartbeat::run(ctx.clone(), stop_background.clone()));
    let stats = tokio::spawn(queue_stats::run(ctx.clone(), stop_background.clone()));
    // Ends with the drain: a draining agent fetches nothing, so nothing needs waking.
    let subscription = ctx.config.sentinel.clone().map(|sentinel| {
        tokio::spawn(sentinel_subscription::run(
            ctx.clone(),
            sentinel,
            ctx.drain.clone(),
        ))
    });

    fetch_loop::run(ctx.clone()).await;

    readiness.set(false);
    ctx.metrics.draining.set(1);
    ctx.jobs.close();
    tracing::info!(
        jobs = ctx.jobs_active(),
        "draining: waiting for running tasks"
    );
    wait_for_jobs(ctx).await;
    tracing::info!("all tasks finished and reported");

    adopting.abort();
    stop_background.cancel();
    let _ = heartbeats.await;
    let _ = stats.await;
    if let Some(subscription) = subscription {
        let _ = subscription.await;
    }
    let offline = ctx.config.stop_budget.report_offline;
    if tokio::time::timeout(offline, heartbeat::report_offline(ctx))
        .await
        .is_err()
    {
        tracing::error!(
            "could not report offline within {offline:?}; Airflow will time this worker out"
        );
    }
    Ok(())
}

/// Follows a task a previous agent started to its end and reports it.
async fn take_over(ctx: &Arc<Context>, LeftBehind { task, remote }: LeftBehind) {
    let job: EdgeJob = match serde_json::from_value(task.job) {
        Ok(job) => job,
        Err(e) => {
            tracing::error!(task = %task.id, error = %e, "the task host holds a task whose job this agent cannot read; it is left alone");
            return;
        }
    };
    let lease = ctx
        .slots
        .reserve()
        .await
        .into_lease(job.concurrency_slots)
        .await;
    ctx.jobs
        .spawn(task_runner::resume(ctx.clone(), job, lease, remote));
}

/// Waits for every running job, applying the drain deadline: when it passes (or a second
/// signal arrives) the tasks are stopped, and they and their reports get the stop budget's
/// `stop_and_report` (inside `--drain-margin`, before the kubelet's SIGKILL).
async fn wait_for_jobs(ctx: &Context) {
    let deadline = async {
        match ctx.config.drain_timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = ctx.jobs.wait() => return,
        _ = ctx.kill.cancelled() => {}
        _ = deadline => {
            tracing::warn!(jobs = ctx.jobs_active(), "drain deadline passed: stopping running tasks");
            ctx.kill.cancel();
        }
    }
    if tokio::time::timeout(ctx.config.stop_budget.stop_and_report, ctx.jobs.wait())
        .await
        .is_err()
    {
        tracing::error!("Airflow did not take every final report in time; exiting anyway");
        ctx.give_up.cancel();
        ctx.jobs.wait().await;
    }
}
