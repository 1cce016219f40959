//! Backlog from Airflow's public REST API v2, through the shared [`RestApiClient`] (token or
//! username/password with a new login on 401). Works where the database is out of reach.
//!
//! The API cannot sum `pool_slots` nor filter or sort on it, so an exact slot count lists the
//! queue's queued and running task instances: `state=queued&state=running&order_by=id`, one
//! page first (which tells the total), then the remaining pages a few at a time. The same
//! listing gives the task counts and the oldest `queued_when`, so nothing else is asked.
//! Cost per queue and refresh: `max(1, ceil(n / page))` requests for `n` queued + running task
//! instances, where `page` is the server's `[api] maximum_page_limit` (100 by default; we ask
//! for up to 1000 and step by what comes back). Pages are read by offset, so a task instance
//! that leaves the list while a queue is read can shift another past a page boundary; ids are
//! de-duplicated, so nothing is counted twice, and the next refresh reads it again.
//!
//! Executor callbacks: one more request per refresh, for all queues at once, lists the queued
//! and running ones (the edge3 provider's `GET /edge_worker/ui/jobs`); each is added to its
//! queue as one task of one slot. When that list does not answer, no queue is answered that
//! refresh (a backlog without its callbacks would be made up); when the credentials may not
//! read it (403), the task instances alone are counted and the log says so.
//!
//! Queues are read concurrently, a few at a time, so that 50 queues do not take 50 round trips
//! in a row nor hit Airflow all at once.
//!
//! A refresh has a time budget for silence: an api-server that accepts connections but never
//! answers would otherwise hold the loop for one request timeout per wave of queues (minutes
//! with many queues), delaying recovery long after it answers again. When no page has been
//! answered for the budget, queues still being read count as failed for this refresh. A large
//! backlog whose pages keep coming is read to the end, however long that takes (pick a
//! staleness limit above it: values are dated from the start of the read).

use crate::sources::{BacklogSource, QueueBacklog, QueueOutcome};
use airflow::edge_callback_jobs::{CallbackCount, QueueCallbacks};
use airflow::edge_worker_list::ListedEdgeWorker;
use airflow::rest_api::{ListedTaskInstance, RestApiClient, RestCredentials, TaskInstancePage};
use airflow::trusted_ca::TrustedCa;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt, TryStreamExt};
use prometheus::IntCounter;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use url::Url;

/// Queues read at the same time.
const CONCURRENT_QUEUES: usize = 8;
/// Pages of one queue read at the same time, once the first page told how many there are.
const CONCURRENT_PAGES: usize = 4;
/// The default time one refresh may go without any answer (see the module doc).
pub const REFRESH_BUDGET: Duration = Duration::from_secs(10);

pub struct AirflowApiSource {
    client: RestApiClient,
    /// Counts every count request sent (logins are the client's business and not counted).
    requests: IntCounter,
    budget: Duration,
    /// Whether the warning that callbacks cannot be counted has been given (once per spell).
    callbacks_forbidden: AtomicBool,
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
            callbacks_forbidden: AtomicBool::new(false),
        })
    }

    /// Replaces the refresh time budget (tests use a short one).
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    async fn page(
        &self,
        queue: &[String],
        offset: u64,
        progress: &Progress,
    ) -> Result<TaskInstancePage, String> {
        self.requests.inc();
        let page = self
            .client
            .task_instances_page(queue, &["queued", "running"], offset)
            .await
            .map_err(|e| format!("queued+running task instances: {e}"));
        progress.answered();
        page
    }

    /// Task instances Airflow holds in `scheduled` on `queue`.
    async fn held_on(&self, queue: &str) -> Result<(String, u64), String> {
        self.requests.inc();
        self.client
            .count(queue, &["scheduled"])
            .await
            .map(|n| (queue.to_string(), n))
            .map_err(|e| format!("scheduled task instances on {queue}: {e}"))
    }

    /// Queued and running executor callbacks by queue (none: an empty map), or why not.
    async fn callbacks(
        &self,
        progress: &Progress,
    ) -> Result<HashMap<String, QueueCallbacks>, String> {
        self.requests.inc();
        let answer = self.client.callbacks_by_queue().await;
        progress.answered();
        match answer {
            Ok(CallbackCount::Counted(callbacks)) => {
                self.callbacks_forbidden.store(false, Ordering::Relaxed);
                Ok(callbacks)
            }
            Ok(CallbackCount::Forbidden(why)) => {
                if !self.callbacks_forbidden.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the backlog counts task instances without executor callbacks: {why}"
                    );
                }
                Ok(HashMap::new())
            }
            Err(e) => Err(format!("executor callbacks: {e}")),
        }
    }

    async fn labelled(&self, queue: &str, progress: &Progress) -> (String, QueueOutcome) {
        (queue.to_owned(), self.queue_backlog(queue, progress).await)
    }

    /// Every queued and running task instance of `queue`, tallied. Queued and running come
    /// from the same listing: a task that starts while the queue is read is still listed once.
    async fn queue_backlog(&self, queue: &str, progress: &Progress) -> QueueOutcome {
        let read_at = SystemTime::now();
        let queue = [queue.to_owned()];
        let first = self.page(&queue, 0, progress).await?;
        let step = first.task_instances.len() as u64;
        let total = first.total_entries;
        if step == 0 && total > 0 {
            // Counting what was listed would make up a 0.
            return Err(format!(
                "the api-server counts {total} queued+running task instances but lists none"
            ));
        }
        let mut tally = Tally::default();
        tally.add(first.task_instances);
        if step > 0 && step < total {
            let offsets = (1..).map(|i| i * step).take_while(|offset| *offset < total);
            let pages: Vec<TaskInstancePage> = futures_util::stream::iter(
                offsets.map(|offset| self.page(&queue, offset, progress)),
            )
            .buffered(CONCURRENT_PAGES)
            .try_collect()
            .await?;
            for page in pages {
                tally.add(page.task_instances);
            }
        }
        Ok(tally.backlog(read_at))
    }
}

/// When the api-server last answered during a refresh (tokio's clock, for paused-time tests).
struct Progress(Mutex<tokio::time::Instant>);

impl Progress {
    fn new() -> Self {
        Progress(Mutex::new(tokio::time::Instant::now()))
    }

    fn answered(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
    }

    /// Resolves once nothing has been answered for `budget`.
    async fn silent_for(&self, budget: Duration) {
        loop {
            let last = *self.0.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() >= budget {
                return;
            }
            tokio::time::sleep_until(last + budget).await;
        }
    }
}

/// The backlog of the task instances listed so far, each counted once.
#[derive(Default)]
struct Tally {
    seen: HashSet<String>,
    backlog: QueueBacklog,
    oldest_queued: Option<SystemTime>,
}

impl Tally {
    fn add(&mut self, listed: Vec<ListedTaskInstance>) {
        for ti in listed {
            if !self.seen.insert(ti.id) {
                continue;
            }
            let slots = ti.pool_slots.max(1);
            match ti.state.as_deref() {
                Some("queued") => {
                    self.backlog.queued_tasks += 1;
                    self.backlog.queued_slots += slots;
                    if let Some(at) = ti.queued_when.as_deref().and_then(parse_time) {
                        if self.oldest_queued.is_none_or(|oldest| at < oldest) {
                            self.oldest_queued = Some(at);
                        }
                    }
                }
                Some("running") => {
                    self.backlog.running_tasks += 1;
                    self.backlog.running_slots += slots;
                }
                _ => {}
            }
        }
    }

    /// The tally with the oldest queued task's wait as of `read_at` (on this host's clock; a
    /// `queued_when` ahead of it waits 0 s).
    fn backlog(self, read_at: SystemTime) -> QueueBacklog {
        QueueBacklog {
            oldest_queued_age: self
                .oldest_queued
                .map(|at| read_at.duration_since(at).unwrap_or_default()),
            ..self.backlog
        }
    }
}

fn parse_time(text: &str) -> Option<SystemTime> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(SystemTime::from)
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

    fn first_task_starts<'a>(
        &'a self,
        queues: &'a [String],
        hosts: &'a [String],
        since: SystemTime,
    ) -> BoxFuture<'a, Result<HashMap<String, SystemTime>, String>> {
        async move {
            self.requests.inc();
            let since = chrono::DateTime::<chrono::Utc>::from(since)
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            let first = self
                .client
                .first_starts_by_host(queues, hosts, &since)
                .await
                .map_err(|e| format!("started task instances: {e}"))?;
            Ok(first
                .into_iter()
                .filter_map(|(host, at)| Some((host, parse_time(&at)?)))
                .collect())
        }
        .boxed()
    }

    fn held_tasks<'a>(
        &'a self,
        queues: &'a [String],
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, String>> {
        async move {
            // One count per queue (`limit=0`: the total only, no task instance listed);
            // collected first, as in `fetch`.
            let calls: Vec<_> = queues.iter().map(|queue| self.held_on(queue)).collect();
            let counts = futures_util::stream::iter(calls)
                .buffer_unordered(CONCURRENT_QUEUES)
                .try_collect()
                .await?;
            Ok(counts)
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
            let progress = Progress::new();
            // Collected first: a closure held across the await trips rustc's Send check.
            let calls: Vec<_> = queues
                .iter()
                .map(|queue| self.labelled(queue, &progress))
                .collect();
            let silence = || {
                format!(
                    "no answer from the api-server for the refresh budget of {}",
                    humantime::format_duration(self.budget)
                )
            };
            let read_at = SystemTime::now();
            let callbacks = async {
                tokio::select! {
                    read = self.callbacks(&progress) => read,
                    _ = progress.silent_for(self.budget) => Err(silence()),
                }
            };
            let tasks = futures_util::stream::iter(calls)
                .buffer_unordered(CONCURRENT_QUEUES)
                .take_until(progress.silent_for(self.budget))
                .collect::<HashMap<String, QueueOutcome>>();
            let (callbacks, mut answered) = tokio::join!(callbacks, tasks);
            queues
                .iter()
                .map(|q| {
                    let outcome = answered.remove(q).unwrap_or_else(|| Err(silence()));
                    let outcome = match &callbacks {
                        Ok(callbacks) => outcome.map(|tasks| match callbacks.get(q) {
                            Some(c) => tasks.with_callbacks(
                                c.queued,
                                c.running,
                                c.oldest_queued
                                    .map(|at| read_at.duration_since(at).unwrap_or_default()),
                            ),
                            None => tasks,
                        }),
                        Err(e) => outcome.and(Err(e.clone())),
                    };
                    (q.clone(), outcome)
                })
                .collect()
        }
        .boxed()
    }
}
