//! Registering the worker with Airflow before any job is fetched, with the versions Airflow
//! runs (see [`crate::versions`]).

use crate::config::ConfigError;
use crate::context::Context;
use crate::versions::{self, Refusal, Reported, Source};
use airflow::backoff::{retry, Backoff};
use airflow::edge_types::WorkerState;
use airflow::ApiError;
use std::cell::Cell;
use std::time::Duration;

pub enum Registered {
    Yes,
    /// A drain started before Airflow accepted us: nothing to do but exit.
    Abandoned,
}

/// Registers, retrying until Airflow accepts. Transport failures, 5xx, a name still marked
/// active (409) and an Edge API not there yet (404) are retried with backoff; an Airflow this
/// agent cannot serve, or a refusal that retrying cannot change, is a [`ConfigError`].
pub async fn register(ctx: &Context) -> anyhow::Result<Registered> {
    // The api-server is asked once for its Airflow version: its answer does not change.
    let asked_airflow = Cell::new(false);
    let asked_airflow = &asked_airflow;
    let registered = retry(Backoff::for_airflow(), ctx.drain.cancelled(), || async move {
        if !asked_airflow.get() {
            match learn_airflow_version(ctx).await {
                Ok(()) => asked_airflow.set(true),
                Err(Attempt::Retry(problem)) => return Err(say(problem)),
                Err(Attempt::Fatal(e)) => return Ok(Err(e)),
            }
        }
        let body = ctx.status.body(
            WorkerState::Starting,
            0,
            ctx.slots.total(),
            ctx.slots.free(),
        );
        let problem = match ctx.edge.register(&ctx.config.worker_name, &body).await {
            Ok(answer) => {
                let edge = ctx.status.versions().edge_provider;
                if answer.versions_match == Some(false) {
                    tracing::warn!("Airflow accepts this worker although its versions differ from Airflow's own ([edge] minimum_acceptable_*_version_for_workers)");
                } else if let Some(problem) = versions::unservable_edge_provider(&edge.version) {
                    return Ok(Err(incompatible(problem)));
                }
                tracing::info!(worker = %ctx.config.worker_name, queues = ?ctx.status.queues(),
                    slots = ctx.slots.total(), airflow = %body.sysinfo.airflow_version,
                    edge_provider = %edge.version, "registered with Airflow");
                return Ok(Ok(Registered::Yes));
            }
            Err(e) if e.status() == Some(400) => match learn_from_refusal(ctx, &e) {
                Ok(learnt) => learnt,
                Err(fatal) => return Ok(Err(fatal)),
            },
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
        Err(say(problem))
    })
    .await;
    registered.unwrap_or(Ok(Registered::Abandoned))
}

fn say(problem: String) -> impl FnOnce(Duration) {
    move |delay: Duration| tracing::warn!(retry_in = ?delay, "registration failed: {problem}")
}

enum Attempt {
    Retry(String),
    Fatal(anyhow::Error),
}

/// Asks the api-server for its Airflow version unless a flag gave one. Only a failure that
/// may pass (transport, 5xx) is retried; when Airflow does not tell, the tasks' Python's
/// version stands in.
async fn learn_airflow_version(ctx: &Context) -> Result<(), Attempt> {
    let current = ctx.status.versions();
    if current.airflow.as_ref().is_some_and(|v| !v.replaceable()) {
        return Ok(());
    }
    let unknown = match ctx.edge.airflow_version().await {
        Ok(Some(version)) => {
            if let Some(problem) = versions::unservable_airflow(&version) {
                return Err(Attempt::Fatal(incompatible(problem)));
            }
            tracing::info!(%version, "Airflow's api-server runs this Airflow version: reporting it");
            ctx.status
                .set_airflow_version(Reported::from_airflow(version));
            return Ok(());
        }
        Err(e) if e.is_retryable() => {
            return Err(Attempt::Retry(format!(
                "asking Airflow for its version: {e}"
            )))
        }
        Ok(None) => "it has no version endpoint beside the Edge API".to_string(),
        Err(e) => e.to_string(),
    };
    match current.airflow {
        Some(detected) => {
            tracing::info!(version = %detected.version, "Airflow's api-server does not tell its version ({unknown}): reporting the tasks' Python's");
            Ok(())
        }
        None => Err(Attempt::Fatal(anyhow::Error::new(
            versions::airflow_unknown(current.detection_problem.as_deref()),
        ))),
    }
}

/// What a 400 to a registration or heartbeat teaches: Airflow's own Edge provider version (or,
/// from edge3 3.4 and older, its Airflow version), which the next attempt reports (the
/// caller's warning says so); anything else is fatal.
pub fn learn_from_refusal(ctx: &Context, e: &ApiError) -> Result<String, anyhow::Error> {
    let current = ctx.status.versions();
    let ours = &current.edge_provider;
    // Registration learns the Airflow version (or fails) before the first attempt.
    let airflow = current.airflow.clone().unwrap_or(Reported {
        version: String::new(),
        source: Source::Placeholder,
    });
    match versions::read_refusal(&e.to_string()) {
        Refusal::EdgeProvider { core } if ours.replaceable() && ours.version != core => {
            if let Some(problem) = versions::unservable_edge_provider(&core) {
                return Err(incompatible(problem));
            }
            ctx.status
                .set_edge_provider_version(Reported::from_airflow(core.clone()));
            Ok(format!(
                "Airflow runs Edge provider {core}, not {}: reporting {core} from now on",
                ours.version
            ))
        }
        Refusal::EdgeProvider { core } => Err(refused(
            "--edge-provider-version",
            format!(
                "Airflow runs Edge provider {core} and refuses {}; leave the flag out to report Airflow's own",
                ours.version
            ),
        )),
        Refusal::Airflow { core: Some(core) }
            if airflow.replaceable() && airflow.version != core =>
        {
            if let Some(problem) = versions::unservable_airflow(&core) {
                return Err(incompatible(problem));
            }
            ctx.status
                .set_airflow_version(Reported::from_airflow(core.clone()));
            Ok(format!(
                "Airflow is {core}, not {}: reporting {core} from now on",
                airflow.version
            ))
        }
        Refusal::Airflow { .. } => {
            let flag = match airflow.source {
                Source::Flag => "--airflow-version",
                _ => "--api-url",
            };
            Err(refused(
                flag,
                format!(
                    "Airflow refuses this worker's Airflow version {}: {e}",
                    airflow.version
                ),
            ))
        }
        Refusal::Other => Err(refused(
            "--api-url",
            format!("Airflow refused to register this worker: {e}"),
        )),
    }
}

/// An Airflow whose versions this agent cannot serve: retrying cannot help.
fn incompatible(problem: String) -> anyhow::Error {
    refused("--api-url", problem)
}

fn refused(flag: &'static str, problem: String) -> anyhow::Error {
    anyhow::Error::new(ConfigError { flag, problem })
}
