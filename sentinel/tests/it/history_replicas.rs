//! Two Sentinel replicas record one story: each runs its own refresh loop and history against
//! the same backlog source, and over the period both were recording their series and
//! decisions are the same. Time is tokio's paused clock (the refresh cadence) and a wall clock
//! derived from it (the history's timestamps): 10 minutes pass in milliseconds.

use astro_sentinel::backlog::cache::{BacklogCache, Snapshot};
use astro_sentinel::backlog::refresh_loop::RefreshLoop;
use astro_sentinel::config::file::Config;
use astro_sentinel::history::answer::HistoryAnswer;
use astro_sentinel::history::clock::WallClock;
use astro_sentinel::history::range::HistoryRange;
use astro_sentinel::history::recorder::{HistoryRecorder, RecorderInputs};
use astro_sentinel::history::store::{History, HistoryData};
use astro_sentinel::metrics::Metrics;
use astro_sentinel::pool::NoClusterSource;
use astro_sentinel::sources::{BacklogSource, QueueBacklog, QueueOutcome};
use futures_util::future::BoxFuture;
use http_server::Readiness;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The backlog both replicas read: what the test sets, answered at once.
#[derive(Default)]
struct SharedSource(Mutex<HashMap<String, QueueBacklog>>);

impl SharedSource {
    fn set(&self, queue: &str, queued: u64, running: u64) {
        self.0
            .lock()
            .unwrap()
            .insert(queue.into(), QueueBacklog::one_slot_tasks(queued, running));
    }
}

impl BacklogSource for SharedSource {
    fn kind(&self) -> &'static str {
        "airflow-api"
    }

    fn fetch<'a>(&'a self, queues: &'a [String]) -> BoxFuture<'a, Vec<(String, QueueOutcome)>> {
        let counts = self.0.lock().unwrap();
        let outcomes = queues
            .iter()
            .map(|q| {
                let outcome = counts.get(q).copied().ok_or_else(|| "no such queue".into());
                (q.clone(), outcome)
            })
            .collect();
        Box::pin(std::future::ready(outcomes))
    }

    fn running_slots_by_host<'a>(
        &'a self,
        _queues: &'a [String],
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, String>> {
        // Not asked: these replicas have no kubernetes section, hence no pod-deletion costs.
        Box::pin(std::future::ready(Err(
            "not served by this test source".into()
        )))
    }
}

/// A wall clock that moves with tokio's (paused) clock.
struct TokioWallClock {
    wall_at_start: SystemTime,
    started: Instant,
}

impl WallClock for TokioWallClock {
    fn now(&self) -> SystemTime {
        self.wall_at_start + self.started.elapsed()
    }
}

const CONFIG: &str = "
refreshInterval: 2s
source: {type: airflow-api, airflowApi: {url: 'http://airflow:8080'}}
auth: {disabled: true}
workers:
  - {name: astro-worker-default, queues: [default], syncSlots: 4, minReplicas: 1, maxReplicas: 5}
";

/// Starts one replica's refresh loop; returns its history.
fn start_replica(
    name: &str,
    source: Arc<SharedSource>,
    clock: Arc<TokioWallClock>,
    shutdown: watch::Receiver<bool>,
) -> Arc<History> {
    let config = Config::parse(CONFIG).unwrap();
    let history = Arc::new(History::new(clock, name.into(), HistoryData::default()));
    let queues = config.distinct_queues();
    let refresh = RefreshLoop {
        source: source.clone(),
        queues: queues.clone(),
        cache: Arc::new(BacklogCache::new(Snapshot::empty(&queues))),
        metrics: Arc::new(Metrics::new()),
        readiness: Readiness::default(),
        interval: config.refresh_interval,
        staleness_limit: config.staleness_limit,
        held_tasks_interval: config.held_tasks_interval,
        history: HistoryRecorder::new(
            history.clone(),
            RecorderInputs {
                workers: config.workers.clone(),
                cluster: Arc::new(NoClusterSource),
                backlog_source_kind: source.kind(),
                refresh_interval: config.refresh_interval,
                staleness_limit: config.staleness_limit,
            },
        ),
        pre_warm: None,
    };
    tokio::spawn(refresh.run(cancelled_on_true(shutdown)));
    history
}

/// The loop stops on a token; this test stops its replicas with one watch channel.
fn cancelled_on_true(mut shutdown: watch::Receiver<bool>) -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
        cancel.cancel();
    });
    token
}

fn answer(history: &History) -> HistoryAnswer {
    let worker = Config::parse(CONFIG).unwrap().workers.remove(0);
    history.answer(&worker, HistoryRange::FifteenMinutes)
}

/// Sleeps until `at` after the start (tokio's paused clock jumps there).
async fn until(start: Instant, at: Duration) {
    tokio::time::sleep_until(start + at).await;
}

#[tokio::test(start_paused = true)]
async fn two_replicas_fed_by_the_same_source_record_the_same_series() {
    let source = Arc::new(SharedSource::default());
    source.set("default", 8, 4);
    let start = Instant::now();
    let clock = Arc::new(TokioWallClock {
        wall_at_start: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        started: start,
    });
    let (stop, stopped) = watch::channel(false);

    let a = start_replica(
        "astro-sentinel-a",
        source.clone(),
        clock.clone(),
        stopped.clone(),
    );
    // The second replica comes up half a minute later (a rollout, a rescheduled pod).
    until(start, Duration::from_secs(30)).await;
    let b = start_replica("astro-sentinel-b", source.clone(), clock.clone(), stopped);

    // The backlog changes between refreshes (they run at even seconds).
    for (second, queued, running) in [(61, 30, 10), (181, 2, 0), (301, 12, 4), (421, 0, 0)] {
        until(start, Duration::from_secs(second)).await;
        source.set("default", queued, running);
    }
    until(start, Duration::from_secs(600)).await;
    let (from_a, from_b) = (answer(&a), answer(&b));
    stop.send(true).unwrap();

    assert_eq!(from_a.recorded_by, "astro-sentinel-a");
    assert_eq!(from_b.recorded_by, "astro-sentinel-b");
    assert_eq!(
        from_a.recording_since.as_deref(),
        Some("2027-01-15T08:00:00Z")
    );
    assert_eq!(
        from_b.recording_since.as_deref(),
        Some("2027-01-15T08:00:30Z")
    );

    // Over the period both recorded, point for point the same.
    let since_b = from_b.recording_since.clone().unwrap();
    let a_since_b: Vec<_> = from_a.series.iter().filter(|p| p.t >= since_b).collect();
    let b_all: Vec<_> = from_b.series.iter().collect();
    assert_eq!(b_all.len(), 57, "10 s points from 08:00:30 to 08:10:00");
    assert_eq!(a_since_b, b_all);
    assert_eq!(from_a.series.len(), 60, "A also has its first half minute");

    // The same decisions, from the same inputs.
    let described = |x: &HistoryAnswer| {
        x.decisions
            .iter()
            .map(|d| {
                format!(
                    "{} {} {}->{} {} {}",
                    d.t, d.what, d.from, d.to, d.formula, d.source
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(described(&from_a), described(&from_b));
    assert_eq!(
        described(&from_a),
        vec![
            "2027-01-15T08:01:02Z desiredReplicas 3->5 ceil(40 / 4) = 10, held within 1..5 at 5 airflow-api",
            "2027-01-15T08:03:02Z desiredReplicas 5->1 ceil(2 / 4) = 1, held within 1..5 airflow-api",
            "2027-01-15T08:05:02Z desiredReplicas 1->4 ceil(16 / 4) = 4, held within 1..5 airflow-api",
            "2027-01-15T08:07:02Z desiredReplicas 4->1 ceil(0 / 4) = 0, held within 1..5 at 1 airflow-api",
        ]
    );
    // Both saw the same two minutes at the maximum (08:01:02 to 08:03:00).
    assert_eq!(from_a.tiles.at_maximum_seconds, Some(120));
    assert_eq!(from_b.tiles.at_maximum_seconds, Some(120));
    assert_eq!(
        from_a.findings[0].text,
        "Ran at its maximum of 5 workers for 2 min."
    );
    assert_eq!(from_a.findings, from_b.findings);
}
