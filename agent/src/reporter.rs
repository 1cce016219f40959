//! Delivers a job's state to Airflow, retrying until Airflow has it.
//!
//! A finished task's state is the one thing the agent must not lose: while Airflow is
//! unreachable the report is retried with backoff, and only an answer that says the request
//! itself is wrong (a 4xx other than 408/429) or the agent's final give-up ends the attempts.

use airflow::backoff::{retry, Backoff};
use airflow::edge_client::EdgeClient;
use airflow::edge_types::{JobState, TaskKey};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Whether the report reached Airflow.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Delivered,
    Refused,
    GaveUp,
}

pub async fn deliver(
    edge: &EdgeClient,
    key: &TaskKey,
    state: JobState,
    give_up: &CancellationToken,
    backoff: Backoff,
) -> Delivery {
    let delivery = retry(backoff, give_up.cancelled(), || async move {
        match edge.set_job_state(key, state).await {
            Ok(()) => Ok(Delivery::Delivered),
            Err(e) if !e.is_retryable() => {
                tracing::error!(task = %key, state = state.as_str(), error = %e, "Airflow refused the job state");
                Ok(Delivery::Refused)
            }
            Err(e) => Err(move |delay: Duration| {
                tracing::warn!(task = %key, state = state.as_str(), error = %e,
                    retry_in = ?delay, "could not report the job state; will retry")
            }),
        }
    })
    .await;
    delivery.unwrap_or_else(|| {
        tracing::error!(task = %key, state = state.as_str(), "job state not delivered before shutdown");
        Delivery::GaveUp
    })
}
