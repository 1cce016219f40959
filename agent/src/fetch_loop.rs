//! The fetch loop: while slots are free and the agent is not draining, ask Airflow for a job.
//!
//! It is work-conserving: after a job arrives it asks again at once, and when a job ends its
//! slot wakes the loop without waiting for the idle interval. Only a fetch that found nothing
//! waits the idle interval — the longer subscribed one while the Sentinel subscription is up,
//! which wakes the loop the moment work is queued (see [`crate::sentinel_subscription`]).

use crate::context::Context;
use crate::task_runner;
use airflow::backoff::Backoff;
use std::sync::Arc;
use std::time::Duration;

/// The longest wait between two fetches while Airflow fails them. Airflow's own retry cap
/// (30 s) would leave a worker idle for up to that long after an outage ends; one request per
/// worker every few seconds is nothing for an api-server that is back, and the jitter keeps
/// the workers from returning in lockstep.
const RETRY_CAP: Duration = Duration::from_secs(4);

/// Returns when the drain starts.
pub async fn run(ctx: Arc<Context>) {
    let mut backoff = Backoff::new(Duration::from_millis(500), RETRY_CAP);
    // Whether this fetch follows a wake-up. One that finds nothing (the job went to another
    // worker, or is not fetchable yet) is followed by the normal idle interval, never the long
    // subscribed one: a wake-up can never delay a job beyond what polling would.
    let mut woken = false;
    loop {
        if ctx.drain.is_cancelled() {
            return;
        }
        if ctx.status.in_maintenance() {
            tokio::select! {
                _ = ctx.drain.cancelled() => return,
                _ = ctx.maintenance_changed.notified() => {}
            }
            continue;
        }
        let reservation = tokio::select! {
            _ = ctx.drain.cancelled() => return,
            reservation = ctx.slots.reserve() => reservation,
        };
        let free = ctx.slots.free() + 1;
        let queues = ctx.status.queues();
        match ctx
            .edge
            .fetch_job(&ctx.config.worker_name, &queues, free)
            .await
        {
            Ok(Some(job)) => {
                backoff.reset();
                woken = false;
                let lease = reservation.into_lease(job.concurrency_slots).await;
                tracing::info!(task = %job.key(), "job received");
                ctx.jobs.spawn(task_runner::run(ctx.clone(), job, lease));
            }
            Ok(None) => {
                backoff.reset();
                drop(reservation);
                let idle = if ctx.wake.subscribed() && !woken {
                    ctx.config.subscribed_idle_fetch_interval
                } else {
                    ctx.config.idle_fetch_interval
                };
                woken = false;
                tokio::select! {
                    _ = ctx.drain.cancelled() => return,
                    _ = ctx.slots.freed() => {}
                    _ = ctx.maintenance_changed.notified() => {}
                    _ = ctx.wake.woken() => woken = true,
                    _ = tokio::time::sleep(idle) => {}
                }
            }
            Err(e) => {
                drop(reservation);
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "fetching a job failed");
                tokio::select! {
                    _ = ctx.drain.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
