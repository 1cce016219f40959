//! Backlog from Airflow's public REST API v2, through the shared [`RestApiClient`] (token or
//! username/password with a new login on 401). Works where the database is out of reach.
//!
//! Cost: two requests per queue per refresh (`state=queued` and `state=running`, each
//! `limit=0` so that only `total_entries` comes back). Queues are read concurrently, a few at
//! a time, so that 50 queues do not take 100 round trips in a row nor hit Airflow all at once.

use crate::backlog_source::{BacklogSource, QueueOutcome};
use airflow::rest_api::{QueueCounts, RestApiClient, RestCredentials};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use prometheus::IntCounter;
use url::Url;

/// Queues read at the same time (each with its two requests in flight together).
const CONCURRENT_QUEUES: usize = 8;

pub struct AirflowApiSource {
    client: RestApiClient,
    /// Counts every count request sent (logins are the client's business and not counted).
    requests: IntCounter,
}

impl AirflowApiSource {
    pub fn new(
        base: &Url,
        credentials: RestCredentials,
        requests: IntCounter,
    ) -> Result<Self, String> {
        let client = RestApiClient::new(base, credentials)
            .map_err(|e| format!("cannot build the REST API client: {e}"))?;
        Ok(AirflowApiSource { client, requests })
    }

    async fn count(&self, queue: &str, state: &str) -> Result<u64, String> {
        self.requests.inc();
        self.client
            .count(queue, state)
            .await
            .map_err(|e| format!("{state} count: {e}"))
    }

    async fn queue_counts(&self, queue: &str) -> QueueOutcome {
        let (queued, running) =
            tokio::try_join!(self.count(queue, "queued"), self.count(queue, "running"))?;
        Ok(QueueCounts { queued, running })
    }
}

impl BacklogSource for AirflowApiSource {
    fn kind(&self) -> &'static str {
        "airflow-api"
    }

    fn fetch<'a>(&'a self, queues: &'a [String]) -> BoxFuture<'a, Vec<(String, QueueOutcome)>> {
        futures_util::stream::iter(queues)
            .map(move |queue| async move { (queue.clone(), self.queue_counts(queue).await) })
            .buffer_unordered(CONCURRENT_QUEUES)
            .collect()
            .boxed()
    }
}
