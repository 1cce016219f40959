//! Registering the worker with Airflow before any job is fetched.

use crate::context::Context;
use airflow::backoff::{retry, Backoff};
use airflow::edge_types::WorkerState;
use std::time::Duration;

pub enum Registered {
    Yes,
    /// A drain started before Airflow accepted us: nothing to do but exit.
    Abandoned,
}

/// Registers, retrying until Airflow accepts. Only a version mismatch is fatal: retrying
/// cannot fix it and Airflow would refuse every call.
pub async fn register(ctx: &Context) -> anyhow::Result<Registered> {
    let registered = retry(Backoff::for_airflow(), ctx.drain.cancelled(), || async move {
        let body = ctx.status.body(
            WorkerState::Starting,
            0,
            ctx.slots.total(),
            ctx.slots.free(),
        );
        let problem = match ctx.edge.register(&ctx.config.worker_name, &body).await {
            Ok(answer) => {
                if answer.versions_match == Some(false) {
                    tracing::warn!("Airflow reports that this worker's versions do not match its own");
                }
                tracing::info!(worker = %ctx.config.worker_name, queues = ?ctx.status.queues(),
                    slots = ctx.slots.total(), "registered with Airflow");
                return Ok(Ok(Registered::Yes));
            }
            Err(e) if e.status() == Some(400) => {
                return Ok(Err(anyhow::anyhow!(
                    "Airflow refused to register this worker (versions: airflow {}, edge provider {}; \
                     set --airflow-version/--edge-provider-version or install matching packages): {e}",
                    body.sysinfo.airflow_version,
                    body.sysinfo.edge_provider_version
                )))
            }
            Err(e) if e.status() == Some(409) => format!(
                "the name {:?} is still marked active in Airflow (a previous worker with this \
                 name stopped without reporting offline; Airflow frees it after its heartbeat \
                 timeout): {e}",
                ctx.config.worker_name
            ),
            Err(e) if matches!(e.status(), Some(404 | 405)) => format!(
                "the Edge API is not at {} (check --api-url and that [edge] api_enabled is True): {e}",
                ctx.config.api_url
            ),
            Err(e) => e.to_string(),
        };
        Err(move |delay: Duration| {
            tracing::warn!(retry_in = ?delay, "registration failed: {problem}")
        })
    })
    .await;
    registered.unwrap_or(Ok(Registered::Abandoned))
}
