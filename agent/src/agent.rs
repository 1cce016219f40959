//! The agent's life: register, run the loops, drain, report offline.

use crate::admin_server;
use crate::config::Config;
use crate::context::Context;
use crate::fetch_loop;
use crate::heartbeat;
use crate::metrics::{EdgeCallMetrics, Metrics};
use crate::queue_stats;
use crate::registration::{self, Registered};
use crate::shutdown;
use crate::slots::Slots;
use crate::task_process::KILL_GRACE;
use crate::task_spawner::{SpawnerSettings, TaskSpawner};
use crate::versions::Versions;
use crate::worker_status::WorkerStatus;
use airflow::edge_client::EdgeClient;
use airflow::edge_token::EdgeTokenSigner;
use anyhow::Context as _;
use http_server::Readiness;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// After tasks were stopped, how long their last logs and states may take to reach Airflow
/// before the agent exits regardless.
const REPORT_GRACE: Duration = Duration::from_secs(30);

/// `task_env` is the environment task processes inherit (see [`crate::task_env`]).
pub async fn run(
    config: Config,
    versions: Versions,
    task_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
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
        stop_admin.clone(),
    ));

    let edge = EdgeClient::new(
        &config.api_url,
        EdgeTokenSigner::new(config.jwt_secret.expose()),
        Box::new(EdgeCallMetrics(metrics.clone())),
        config.ca.as_ref(),
    )
    .context("building the HTTP client")?;
    let spawner = TaskSpawner::new(
        SpawnerSettings {
            python: &config.python,
            work_dir_in: &std::env::temp_dir(),
            execution_api_url: config.execution_api_url.as_str(),
            worker_name: &config.worker_name,
            log_folder: &config.log_folder,
            mode: config.launch_mode,
            slots: config.sync_slots,
        },
        task_env.into_iter(),
    )
    .context("creating the private work directory for workload files")?;
    // The launcher imports Airflow (seconds) while the worker registers and fetches: a job that
    // arrives before it is ready waits for it (see `PreforkLauncher::launch`).
    let stop_launcher = CancellationToken::new();
    let launcher = spawner
        .prefork_launcher()
        .map(|launcher| tokio::spawn(launcher.supervise(stop_launcher.clone())));
    let ctx = Arc::new(Context {
        slots,
        status: WorkerStatus::new(
            config.queues.clone(),
            versions.airflow,
            versions.edge_provider,
        ),
        config,
        edge,
        metrics,
        spawner,
        jobs: TaskTracker::new(),
        drain,
        kill,
        give_up: CancellationToken::new(),
        heartbeat_now: Notify::new(),
        maintenance_changed: Notify::new(),
    });

    let outcome = serve(&ctx, &readiness).await;
    stop_launcher.cancel();
    if let Some(launcher) = launcher {
        let _ = launcher.await;
    }
    stop_admin.cancel();
    let _ = admin.await;
    outcome
}

async fn serve(ctx: &Arc<Context>, readiness: &Readiness) -> anyhow::Result<()> {
    if let Registered::Abandoned = registration::register(ctx).await? {
        tracing::info!("stopped before registration completed");
        return Ok(());
    }
    // Ready: registered with Airflow, until the drain begins.
    readiness.set(true);
    let stop_background = CancellationToken::new();
    let heartbeats = tokio::spawn(heartbeat::run(ctx.clone(), stop_background.clone()));
    let stats = tokio::spawn(queue_stats::run(ctx.clone(), stop_background.clone()));

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

    stop_background.cancel();
    let _ = heartbeats.await;
    let _ = stats.await;
    heartbeat::report_offline(ctx).await;
    Ok(())
}

/// Waits for every running job, applying the drain deadline: when it passes (or a second
/// signal arrives) the tasks are stopped, and their reports get [`REPORT_GRACE`] to go out.
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
    if tokio::time::timeout(KILL_GRACE + REPORT_GRACE, ctx.jobs.wait())
        .await
        .is_err()
    {
        tracing::error!("Airflow did not take every final report in time; exiting anyway");
        ctx.give_up.cancel();
        ctx.jobs.wait().await;
    }
}
