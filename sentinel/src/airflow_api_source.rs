//! Backlog from Airflow's public REST API v2, through the shared [`RestApiClient`] (token or
//! username/password with a new login on 401). Works where the database is out of reach.
//!
//! Cost: two requests per queue per refresh (`state=queued&state=running` and `state=queued`,
//! each `limit=0` so that only `total_entries` comes back). Queues are read concurrently, a few at
//! a time, so that 50 queues do not take 100 round trips in a row nor hit Airflow all at once.
//!
//! A refresh has a time budget: an api-server that accepts connections but never answers
//! would otherwise hold the loop for one request timeout per wave of queues (minutes with
//! many queues), delaying recovery long after it answers again. Queues without an answer when
//! the budget runs out count as failed for this refresh.

use crate::backlog_source::{BacklogSource, QueueOutcome};
use airflow::edge_worker_list::ListedEdgeWorker;
use airflow::rest_api::{QueueCounts, RestApiClient, RestCredentials};
use airflow::trusted_ca::TrustedCa;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use prometheus::IntCounter;
use std::collections::HashMap;
use std::time::Duration;
use url::Url;

/// Queues read at the same time (each with its two requests in flight together).
const CONCURRENT_QUEUES: usize = 8;
/// The default time budget of one refresh (see the module doc).
pub const REFRESH_BUDGET: Duration = Duration::from_secs(10);

pub struct AirflowApiSource {
    client: RestApiClient,
    /// Counts every count request sent (logins are the client's business and not counted).
    requests: IntCounter,
    budget: Duration,
}

impl AirflowApiSource {
    pub fn new(
        base: &Url,
        credentials: RestCredentials,
        requests: IntCounter,
        ca: Option<&TrustedCa>,
    ) -> Result<Self, String> {
        let client = RestApiClient::new(
            base,
            credentials,
            concat!("astro-sentinel/", env!("CARGO_PKG_VERSION")),
            ca,
        )
        .map_err(|e| format!("cannot build the REST API client: {e}"))?;
        Ok(AirflowApiSource {
            client,
            requests,
            budget: REFRESH_BUDGET,
        })
    }

    /// Replaces the refresh time budget (tests use a short one).
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    async fn count(&self, queue: &str, states: &[&str]) -> Result<u64, String> {
        self.requests.inc();
        self.client
            .count(queue, states)
            .await
            .map_err(|e| format!("{} count: {e}", states.join("+")))
    }

    async fn labelled(&self, queue: &str) -> (String, QueueOutcome) {
        (queue.to_owned(), self.queue_counts(queue).await)
    }

    /// Queued + running in one request and queued alone in another, sent together: the
    /// backlog (their sum, what KEDA reads) is one consistent count; asking for each state on
    /// its own could count a task that starts in between twice.
    async fn queue_counts(&self, queue: &str) -> QueueOutcome {
        let (backlog, queued) = tokio::try_join!(
            self.count(queue, &["queued", "running"]),
            self.count(queue, &["queued"])
        )?;
        let queued = queued.min(backlog);
        Ok(QueueCounts {
            queued,
            running: backlog - queued,
        })
    }
}

impl BacklogSource for AirflowApiSource {
    fn kind(&self) -> &'static str {
        "airflow-api"
    }

    fn running_slots_by_host<'a>(
        &'a self,
        queues: &'a [String],
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, String>> {
        async move {
            self.requests.inc();
            self.client
                .running_slots_by_host(queues)
                .await
                .map_err(|e| format!("running task instances: {e}"))
        }
        .boxed()
    }

    fn edge_workers(&self) -> BoxFuture<'_, Result<Vec<ListedEdgeWorker>, String>> {
        async move {
            self.requests.inc();
            self.client
                .edge_workers()
                .await
                .map_err(|e| format!("Edge workers: {e}"))
        }
        .boxed()
    }

    fn fetch<'a>(&'a self, queues: &'a [String]) -> BoxFuture<'a, Vec<(String, QueueOutcome)>> {
        async move {
            // Collected first: a closure held across the await trips rustc's Send check.
            let calls: Vec<_> = queues.iter().map(|queue| self.labelled(queue)).collect();
            let mut answered: HashMap<String, QueueOutcome> = futures_util::stream::iter(calls)
                .buffer_unordered(CONCURRENT_QUEUES)
                .take_until(tokio::time::sleep(self.budget))
                .collect()
                .await;
            queues
                .iter()
                .map(|q| {
                    let outcome = answered.remove(q).unwrap_or_else(|| {
                        Err(format!(
                            "no answer within the refresh budget of {}",
                            humantime::format_duration(self.budget)
                        ))
                    });
                    (q.clone(), outcome)
                })
                .collect()
        }
        .boxed()
    }
}
