//! Keeps `astro_agent_client_queue_stats{queue,state}` equal to Airflow's own counts.
//!
//! The counts are queue-wide, read from the REST API, so every pod of a Deployment exports the
//! same numbers (the prometheus-adapter rule takes their max). A queue whose counts cannot be
//! refreshed keeps its last values for a few rounds, then its series are removed: an absent
//! metric holds the HPA where it is, while an old number could scale the pool the wrong way.
//!
//! Executor callbacks (Airflow 3.3, edge3 5.x) are counted as the Edge executor counts them:
//! one job each, queued then running, on `[operators] default_queue` (see
//! [`airflow::edge_callback_jobs`]). One more request per refresh lists them for all queues; a
//! provider without that list (404) has none to count; credentials not allowed to read it
//! (403) count the tasks alone, with a warning. When the list does not answer, no queue is
//! refreshed that round: a count without its callbacks would be a made-up number.

use crate::context::Context;
use airflow::edge_callback_jobs::{CallbackCount, QueueCallbacks};
use airflow::rest_api::RestApiClient;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Failed refreshes in a row after which a queue's last values are withdrawn.
const MAX_STALE_ROUNDS: u32 = 3;
const STATES: [&str; 2] = ["queued", "running"];

pub async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let Some(rest) = &ctx.config.rest_api else {
        tracing::warn!(
            "queue stats are off: no --rest-api-url; astro_agent_client_queue_stats will not be exported"
        );
        return;
    };
    let client = match RestApiClient::new(
        &rest.url,
        rest.credentials.clone(),
        concat!("astro-agent/", env!("CARGO_PKG_VERSION")),
        ctx.config.ca.as_ref(),
    ) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "queue stats are off: cannot build the REST client");
            return;
        }
    };
    let mut failures: HashMap<String, u32> = HashMap::new();
    let mut exported: Vec<String> = Vec::new();
    // Whether the warning that callbacks cannot be counted has been given (once per spell).
    let mut callbacks_forbidden = false;
    let mut interval = tokio::time::interval(ctx.config.heartbeat_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = interval.tick() => {}
        }
        let queues = ctx.status.queues();
        // Queues Airflow took away from this worker are no longer ours to report.
        for gone in exported.iter().filter(|q| !queues.contains(q)) {
            remove(&ctx, gone);
        }
        exported.retain(|q| queues.contains(q));
        let callbacks = match client.callbacks_by_queue().await {
            Ok(CallbackCount::Counted(callbacks)) => {
                callbacks_forbidden = false;
                Ok(callbacks)
            }
            Ok(CallbackCount::Forbidden(why)) => {
                if !callbacks_forbidden {
                    tracing::warn!("queue stats count tasks without executor callbacks: {why}");
                    callbacks_forbidden = true;
                }
                Ok(HashMap::new())
            }
            Err(e) => Err(e),
        };
        for queue in &queues {
            let counts = match &callbacks {
                Ok(callbacks) => client
                    .queue_counts(queue)
                    .await
                    .map(|tasks| {
                        let none = QueueCallbacks::default();
                        let of_queue = callbacks.get(queue).unwrap_or(&none);
                        (
                            tasks.queued + of_queue.queued,
                            tasks.running + of_queue.running,
                        )
                    })
                    .map_err(|e| e.to_string()),
                Err(e) => Err(format!("the executor callbacks could not be counted: {e}")),
            };
            match counts {
                Ok((queued, running)) => {
                    failures.remove(queue);
                    let m = &ctx.metrics.queue_stats;
                    m.with_label_values(&[queue.as_str(), "queued"])
                        .set(queued as i64);
                    m.with_label_values(&[queue.as_str(), "running"])
                        .set(running as i64);
                    if !exported.contains(queue) {
                        exported.push(queue.clone());
                    }
                }
                Err(e) => {
                    ctx.metrics.queue_stats_refresh_failures.inc();
                    let n = failures.entry(queue.clone()).or_default();
                    *n += 1;
                    tracing::warn!(queue, error = %e, failures = *n, "queue stats refresh failed");
                    if *n >= MAX_STALE_ROUNDS && exported.contains(queue) {
                        tracing::warn!(queue, "queue stats withdrawn until Airflow answers again");
                        remove(&ctx, queue);
                        exported.retain(|q| q != queue);
                    }
                }
            }
        }
    }
}

fn remove(ctx: &Context, queue: &str) {
    for state in STATES {
        let _ = ctx.metrics.queue_stats.remove_label_values(&[queue, state]);
    }
}
