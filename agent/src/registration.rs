//! Registering the worker with Airflow before any job is fetched.

use crate::config::ConfigError;
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
            Err(e) if e.status() == Some(400) && ctx.status.edge_provider_unknown() => {
                match core_edge_provider_version(&e.to_string()) {
                    Some(version) => {
                        tracing::info!(%version, "the tasks' Python has no Edge provider: reporting the one Airflow runs");
                        ctx.status.learn_edge_provider_version(version);
                        format!("learnt the Edge provider version from Airflow's answer: {e}")
                    }
                    None => {
                        return Ok(Err(anyhow::Error::new(ConfigError {
                            flag: "--edge-provider-version",
                            problem: format!("not given, the tasks' Python has no apache-airflow-providers-edge3, and Airflow's answer does not name its own: {e}"),
                        })))
                    }
                }
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

/// The Edge provider version Airflow runs, from its refusal of another one ("Edge Worker runs
/// on Edge Provider 0.0.0 and the core runs on 5.1.0. Rejecting access due to difference.").
fn core_edge_provider_version(refusal: &str) -> Option<String> {
    let (_, after) = refusal.split_once("and the core runs on ")?;
    let version = after
        .split_whitespace()
        .next()?
        .trim_end_matches(['.', '"', ',']);
    (!version.is_empty() && version.chars().next()?.is_ascii_digit()).then(|| version.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_core_version_from_airflows_refusal() {
        let body = r#"register: HTTP 400: {"detail":"Edge Worker runs on Edge Provider 0.0.0 and the core runs on 5.1.0. Rejecting access due to difference."}"#;
        assert_eq!(core_edge_provider_version(body).as_deref(), Some("5.1.0"));
        let airflow = r#"HTTP 400: {"detail":"Edge Worker runs on Airflow 3.2.0 which is below the minimum acceptable version None. Rejecting access due to incompatible version."}"#;
        assert_eq!(core_edge_provider_version(airflow), None);
    }
}
