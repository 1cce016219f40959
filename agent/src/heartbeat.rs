//! Heartbeats: tell Airflow the worker's state on a fixed cadence and at once when it changes,
//! and apply what Airflow answers (queues, concurrency, maintenance, shutdown request).

use crate::context::Context;
use crate::registration;
use airflow::backoff::{retry, Backoff};
use airflow::edge_types::WorkerState;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Runs until `stop` is cancelled.
pub async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let mut interval = tokio::time::interval(ctx.config.heartbeat_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A failed beat is retried (`beat` logs why), never longer apart than the interval.
    let backoff = Backoff::for_airflow().at_most(ctx.config.heartbeat_interval);
    let mut last_state = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = interval.tick() => {}
            _ = ctx.heartbeat_now.notified() => {
                // Between beats Airflow needs to hear at once only that the state changed
                // (idle <-> running); a job count alone waits for the interval, so a busy
                // worker does not add two requests per task to the api-server's load.
                if Some(current_state(&ctx)) == last_state {
                    continue;
                }
            }
            _ = ctx.drain.cancelled(), if !ctx.drain.is_cancelled() => {}
        }
        let context: &Context = &ctx;
        let sent = retry(backoff.clone(), stop.cancelled(), || async move {
            beat(context).await.ok_or(|_: Duration| {})
        })
        .await;
        match sent {
            Some(sent) => last_state = Some(sent),
            None => return,
        }
    }
}

fn current_state(ctx: &Context) -> WorkerState {
    ctx.status
        .state(ctx.jobs_active(), ctx.drain.is_cancelled())
}

/// One heartbeat; the state it told Airflow when Airflow accepted it.
async fn beat(ctx: &Context) -> Option<WorkerState> {
    let jobs = ctx.jobs_active();
    let state = ctx.status.state(jobs, ctx.drain.is_cancelled());
    // While jobs still run, `offline` would be a lie: the drain reports `terminating`.
    let body = ctx
        .status
        .body(state, jobs, ctx.slots.total(), ctx.slots.free());
    match ctx.edge.heartbeat(&ctx.config.worker_name, &body).await {
        Ok(answer) => {
            ctx.metrics.heartbeat_accepted();
            let queues = ctx.status.queues();
            let requests = ctx.status.apply(&answer, ctx.slots.total());
            if ctx.status.queues() != queues {
                ctx.wake.queues_changed();
            }
            if let Some(concurrency) = requests.concurrency {
                ctx.slots.resize(concurrency);
            }
            ctx.drift.check(ctx.slots.total(), &ctx.status.queues());
            if requests.maintenance_changed {
                ctx.maintenance_changed.notify_one();
            }
            if requests.shutdown && !ctx.drain.is_cancelled() {
                tracing::info!("Airflow requested shutdown: draining");
                ctx.drain.cancel();
            }
            Some(state)
        }
        Err(e) if e.status() == Some(400) => {
            // Airflow refuses heartbeats from a worker whose versions no longer match (the
            // server was upgraded under us). A version its refusal names is reported from the
            // next beat on; otherwise stop taking work and let running tasks finish.
            match registration::learn_from_refusal(ctx, &e) {
                Ok(learnt) => tracing::warn!("Airflow refused the heartbeat: {learnt}"),
                Err(fatal) => {
                    tracing::error!("Airflow refused the heartbeat: {fatal}; draining");
                    ctx.drain.cancel();
                    return Some(state);
                }
            }
            None
        }
        Err(e) if e.status() == Some(404) => {
            // An admin deleted this worker in Airflow's UI while it ran: register again, so
            // that its running jobs can still be reported and new ones fetched.
            tracing::warn!(error = %e, "Airflow no longer knows this worker; registering again");
            let body = ctx
                .status
                .body(state, jobs, ctx.slots.total(), ctx.slots.free());
            match ctx.edge.register(&ctx.config.worker_name, &body).await {
                Ok(_) => Some(state),
                Err(e) => {
                    tracing::warn!(error = %e, "registering again failed");
                    None
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "heartbeat failed");
            None
        }
    }
}

/// How often the last heartbeat is tried.
const OFFLINE_ATTEMPTS: u32 = 5;

/// The last heartbeat: `offline`, so Airflow frees the name at once instead of waiting for the
/// heartbeat timeout. A few attempts inside the caller's time limit, then the agent exits anyway.
pub async fn report_offline(ctx: &Context) {
    let state = if ctx.status.in_maintenance() {
        WorkerState::OfflineMaintenance
    } else {
        WorkerState::Offline
    };
    let body = ctx
        .status
        .body(state, 0, ctx.slots.total(), ctx.slots.total());
    let body = &body;
    let mut attempts = 0;
    retry(Backoff::for_airflow(), std::future::pending(), || {
        attempts += 1;
        let last = attempts == OFFLINE_ATTEMPTS;
        async move {
            match ctx.edge.heartbeat(&ctx.config.worker_name, body).await {
                Ok(_) => tracing::info!("reported offline to Airflow"),
                Err(e) if !last && e.is_retryable() => {
                    return Err(move |_: Duration| {
                        tracing::warn!(error = %e, "reporting offline failed; retrying")
                    })
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not report offline; Airflow will time this worker out")
                }
            }
            Ok(())
        }
    })
    .await;
}
