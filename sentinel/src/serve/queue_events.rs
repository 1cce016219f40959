//! `GET /v1/queues/events?queue=a&queue=b`: the stream that wakes idle agents the moment new
//! work is queued on one of their queues, as Server-Sent Events.
//!
//! Subscriptions are by queue, not by worker pool: an agent knows its queues (and Airflow can
//! change them), not the name of the pool the chart gave its Deployment.
//!
//! The stream is driven by the refresh loop's snapshots (the cache), never by reads of its
//! own: however many agents listen, the source is read once per refresh interval. A subscriber
//! holds a `watch` receiver, so a slow reader is never a queue of events: it reads the latest
//! state when it is ready for the next one.
//!
//! Events (each `data` is JSON `{"queues": {"<queue>": {"queued": n, "running": m}}}`):
//! * `subscribed`: the state when the stream opens (an agent with free slots fetches if
//!   anything is queued: it may have missed a rise while it was not subscribed);
//! * `rose`: new work appeared on a subscribed queue: its queued count rose, or its queued plus
//!   running count rose (a task was queued while another started);
//! * `unavailable` (`{"error": …}`), then the stream ends: the Sentinel cannot see the queue
//!   right now (the latest read failed, or no refresh came in time), so the agent must poll;
//! * `reconnect`, then the stream ends: a planned close (shutdown, or the stream's
//!   [`MAX_STREAM_AGE`], after which the agent's token is checked again);
//! * a `: keep-alive` comment every [`KEEP_ALIVE`], so that both ends notice a dead
//!   connection: the agent after three missed ones, the Sentinel when a write stalls.

use crate::backlog::cache::{BacklogCache, Snapshot};
use crate::metrics::queue_events::QueueEventMetrics;
use crate::serve::response::{error, Body};
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How often a quiet stream says it is alive. The agent gives up after three missed.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// A stream ends after this long (the agent reconnects at once): the agent's token is checked
/// again well within the ten minutes a projected token lives at least.
pub const MAX_STREAM_AGE: Duration = Duration::from_secs(300);
/// At most this many queues per stream: an agent serves a handful.
const MAX_QUEUES: usize = 64;

/// The streams' shared state: the cap on subscribers and what every stream reads.
pub struct QueueEvents {
    cache: Arc<BacklogCache>,
    permits: Arc<Semaphore>,
    metrics: QueueEventMetrics,
    staleness_limit: Duration,
    /// A stream whose snapshots stop coming for this long says `unavailable`: the refresh
    /// loop is stuck, and the agent must not wait for a wake-up that cannot come.
    silence_limit: Duration,
    shutdown: CancellationToken,
}

/// One subscribed queue's counts, as the stream last told them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
struct Counts {
    queued: u64,
    running: u64,
}

type State = BTreeMap<String, Counts>;

impl QueueEvents {
    pub fn new(
        cache: Arc<BacklogCache>,
        max_subscribers: usize,
        metrics: QueueEventMetrics,
        refresh_interval: Duration,
        staleness_limit: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        QueueEvents {
            cache,
            permits: Arc::new(Semaphore::new(max_subscribers)),
            metrics,
            staleness_limit,
            silence_limit: refresh_interval * 3 + Duration::from_secs(5),
            shutdown,
        }
    }

    /// Opens a stream for the `queue` parameters of `query`, or answers why not: 400 for no or
    /// too many queues, 404 for a queue the Sentinel does not read, 503 when it cannot see
    /// them now or every subscriber slot is taken.
    pub fn subscribe(&self, query: Option<&str>) -> Response<Body> {
        let queues = match self.queues(query) {
            Ok(queues) => queues,
            Err((status, why)) => return error(status, why),
        };
        let snapshots = self.cache.subscribe();
        let state = match read_state(&snapshots.borrow(), &queues, self.staleness_limit) {
            Ok(state) => state,
            Err(why) => return error(StatusCode::SERVICE_UNAVAILABLE, why),
        };
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "every queue-event subscriber slot is taken (queueEvents.maxSubscribers)".into(),
            );
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(KEEP_ALIVE.as_secs() * 3));
            return r;
        };
        let stream = Stream {
            queues,
            snapshots,
            told: state,
            phase: Phase::Opening,
            staleness_limit: self.staleness_limit,
            silence_limit: self.silence_limit,
            last_snapshot: tokio::time::Instant::now(),
            ends_at: tokio::time::Instant::now() + MAX_STREAM_AGE,
            shutdown: self.shutdown.clone(),
            subscriber: Subscriber::new(permit, self.metrics.clone()),
        };
        let frames = futures_util::stream::unfold(stream, |mut stream| async move {
            let text = stream.next_event().await?;
            stream
                .subscriber
                .metrics
                .sent
                .with_label_values(&[text.0])
                .inc();
            Some((Ok(Frame::data(Bytes::from(text.1))), stream))
        });
        let mut r = Response::new(StreamBody::new(frames).boxed_unsync());
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    }

    fn queues(&self, query: Option<&str>) -> Result<Vec<String>, (StatusCode, String)> {
        let mut queues: Vec<String> =
            url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .filter(|(key, _)| key == "queue")
                .map(|(_, value)| value.into_owned())
                .collect();
        queues.sort();
        queues.dedup();
        if queues.is_empty() || queues.len() > MAX_QUEUES {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("queue: give between 1 and {MAX_QUEUES} queue parameters"),
            ));
        }
        let snapshot = self.cache.snapshot();
        if let Some(unknown) = queues.iter().find(|q| snapshot.queue(q).is_none()) {
            return Err((
                StatusCode::NOT_FOUND,
                format!("queue {unknown:?}: no configured worker serves it"),
            ));
        }
        Ok(queues)
    }
}

/// The subscribed queues' counts in `snapshot`, or why they cannot be vouched for.
fn read_state(
    snapshot: &Snapshot,
    queues: &[String],
    staleness_limit: Duration,
) -> Result<State, String> {
    let now = Instant::now();
    queues
        .iter()
        .map(|queue| {
            let entry = snapshot
                .queue(queue)
                .ok_or_else(|| format!("queue {queue:?}: no configured worker serves it"))?;
            if let Some(error) = &entry.last_error {
                return Err(format!("queue {queue:?}: the latest read failed: {error}"));
            }
            let reading = entry
                .last
                .ok_or_else(|| format!("queue {queue:?}: not read yet"))?;
            if now.saturating_duration_since(reading.at) > staleness_limit {
                return Err(format!("queue {queue:?}: its value is stale"));
            }
            Ok((
                queue.clone(),
                Counts {
                    queued: reading.backlog.queued_tasks,
                    running: reading.backlog.running_tasks,
                },
            ))
        })
        .collect()
}

/// Whether new work appeared between `before` and `after`. A started task moves one from
/// queued to running, a finished one leaves running: so a rise of queued, or of queued plus
/// running, can only be new work.
fn rose(before: &State, after: &State) -> bool {
    after.iter().any(|(queue, now)| match before.get(queue) {
        Some(then) => {
            now.queued > then.queued || now.queued + now.running > then.queued + then.running
        }
        None => now.queued > 0,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Opening,
    Open,
    Ended,
}

/// Holds a subscriber slot and counts the stream in the gauge while it lives.
struct Subscriber {
    _permit: OwnedSemaphorePermit,
    metrics: QueueEventMetrics,
}

impl Subscriber {
    fn new(permit: OwnedSemaphorePermit, metrics: QueueEventMetrics) -> Self {
        metrics.subscribers.inc();
        Subscriber {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.metrics.subscribers.dec();
    }
}

struct Stream {
    queues: Vec<String>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// The state the agent was last told (or the state at the last snapshot: a fall is not
    /// told, but the next rise is measured from it).
    told: State,
    phase: Phase,
    staleness_limit: Duration,
    silence_limit: Duration,
    last_snapshot: tokio::time::Instant,
    ends_at: tokio::time::Instant,
    shutdown: CancellationToken,
    subscriber: Subscriber,
}

/// An event's metric label and its text on the wire.
type Event = (&'static str, String);

fn event(name: &'static str, data: &serde_json::Value) -> Event {
    (name, format!("event: {name}\ndata: {data}\n\n"))
}

fn state_event(name: &'static str, state: &State) -> Event {
    event(name, &serde_json::json!({ "queues": state }))
}

impl Stream {
    /// The next event to send, or `None` once the stream has ended.
    async fn next_event(&mut self) -> Option<Event> {
        match self.phase {
            Phase::Ended => return None,
            Phase::Opening => {
                self.phase = Phase::Open;
                self.snapshots.mark_unchanged();
                return Some(state_event("subscribed", &self.told));
            }
            Phase::Open => {}
        }
        let mut keep_alive =
            tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
        loop {
            let silent_until = self.last_snapshot + self.silence_limit;
            tokio::select! {
                _ = self.shutdown.cancelled() => return Some(self.end("reconnect", "the Sentinel is stopping")),
                _ = tokio::time::sleep_until(self.ends_at) => return Some(self.end("reconnect", "the stream reached its maximum age")),
                _ = tokio::time::sleep_until(silent_until) => {
                    return Some(self.end("unavailable", "no backlog refresh came in time"))
                }
                _ = keep_alive.tick() => return Some(("keep_alive", ": keep-alive\n\n".into())),
                changed = self.snapshots.changed() => {
                    if changed.is_err() {
                        return Some(self.end("reconnect", "the Sentinel is stopping"));
                    }
                    self.last_snapshot = tokio::time::Instant::now();
                    let snapshot = self.snapshots.borrow_and_update().clone();
                    match read_state(&snapshot, &self.queues, self.staleness_limit) {
                        Err(why) => return Some(self.end("unavailable", &why)),
                        Ok(state) => {
                            let woke = rose(&self.told, &state);
                            self.told = state;
                            if woke {
                                return Some(state_event("rose", &self.told));
                            }
                        }
                    }
                }
            }
        }
    }

    fn end(&mut self, name: &'static str, why: &str) -> Event {
        self.phase = Phase::Ended;
        event(name, &serde_json::json!({ "error": why }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::QueueBacklog;
    use std::time::SystemTime;

    fn state(entries: &[(&str, u64, u64)]) -> State {
        entries
            .iter()
            .map(|(q, queued, running)| {
                (
                    q.to_string(),
                    Counts {
                        queued: *queued,
                        running: *running,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn new_work_is_a_rise_of_queued_or_of_queued_plus_running() {
        let before = state(&[("a", 1, 1), ("b", 0, 0)]);
        assert!(rose(&before, &state(&[("a", 2, 1), ("b", 0, 0)])));
        assert!(
            rose(&before, &state(&[("a", 1, 2), ("b", 0, 0)])),
            "one started, one queued"
        );
        assert!(rose(&before, &state(&[("a", 1, 1), ("b", 1, 0)])));
        assert!(
            !rose(&before, &state(&[("a", 0, 2), ("b", 0, 0)])),
            "one started"
        );
        assert!(
            !rose(&before, &state(&[("a", 1, 0), ("b", 0, 0)])),
            "one finished"
        );
        assert!(!rose(&before, &before));
    }

    fn published(cache: &BacklogCache, queued: u64, running: u64) {
        let mut next = (*cache.snapshot()).clone();
        next.record(
            "a",
            Ok(QueueBacklog::one_slot_tasks(queued, running)),
            Instant::now(),
            SystemTime::now(),
        );
        cache.publish(next);
    }

    fn events(max_subscribers: usize) -> (Arc<BacklogCache>, QueueEvents, CancellationToken) {
        let cache = Arc::new(BacklogCache::new(Snapshot::empty(&["a".to_string()])));
        let metrics = QueueEventMetrics::register(&prometheus::Registry::new());
        let shutdown = CancellationToken::new();
        let events = QueueEvents::new(
            cache.clone(),
            max_subscribers,
            metrics,
            Duration::from_millis(500),
            Duration::from_secs(30),
            shutdown.clone(),
        );
        (cache, events, shutdown)
    }

    async fn next_text(body: &mut Body) -> String {
        let frame = body.frame().await.expect("a frame").expect("no error");
        String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn refuses_what_it_cannot_vouch_for() {
        let (cache, events, _) = events(1);
        assert_eq!(events.subscribe(None).status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            events.subscribe(Some("queue=zz")).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            events.subscribe(Some("queue=a")).status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "not read yet: never a made-up 0"
        );
        published(&cache, 0, 0);
        let first = events.subscribe(Some("queue=a"));
        assert_eq!(first.status(), StatusCode::OK);
        let second = events.subscribe(Some("queue=a"));
        assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE, "one slot");
        assert!(second.headers().contains_key(RETRY_AFTER));
        assert_eq!(events.metrics.subscribers.get(), 1);
        drop(first);
        assert_eq!(events.metrics.subscribers.get(), 0);
        assert_eq!(events.subscribe(Some("queue=a")).status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn tells_the_state_then_each_rise_and_only_the_latest_state() {
        let (cache, events, shutdown) = events(4);
        published(&cache, 0, 0);
        let mut body = events.subscribe(Some("queue=a")).into_body();
        assert_eq!(
            next_text(&mut body).await,
            "event: subscribed\ndata: {\"queues\":{\"a\":{\"queued\":0,\"running\":0}}}\n\n"
        );
        published(&cache, 0, 0);
        published(&cache, 1, 0);
        assert!(next_text(&mut body).await.starts_with("event: rose\n"));
        // A started task is no news; a slow reader then sees only the latest of two rises.
        published(&cache, 0, 1);
        published(&cache, 2, 1);
        published(&cache, 3, 1);
        assert_eq!(
            next_text(&mut body).await,
            "event: rose\ndata: {\"queues\":{\"a\":{\"queued\":3,\"running\":1}}}\n\n"
        );
        shutdown.cancel();
        assert!(next_text(&mut body).await.starts_with("event: reconnect\n"));
        assert!(body.frame().await.is_none(), "ended");
        let sent = |e: &str| events.metrics.sent.with_label_values(&[e]).get();
        assert_eq!(
            (sent("subscribed"), sent("rose"), sent("reconnect")),
            (1, 2, 1)
        );
    }

    #[tokio::test]
    async fn a_failed_read_ends_the_stream_so_the_agent_polls() {
        let (cache, events, _) = events(4);
        published(&cache, 0, 0);
        let mut body = events.subscribe(Some("queue=a")).into_body();
        next_text(&mut body).await;
        let mut next = (*cache.snapshot()).clone();
        next.record(
            "a",
            Err("db down".into()),
            Instant::now(),
            SystemTime::now(),
        );
        cache.publish(next);
        let text = next_text(&mut body).await;
        assert!(
            text.starts_with("event: unavailable\n") && text.contains("db down"),
            "{text}"
        );
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn keeps_alive_and_gives_up_when_refreshes_stop() {
        let (cache, events, _) = events(4);
        published(&cache, 0, 0);
        let mut body = events.subscribe(Some("queue=a")).into_body();
        next_text(&mut body).await;
        // Refreshes every half second keep it open; a quiet stream says it is alive.
        let refreshes = async {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                published(&cache, 0, 0);
            }
        };
        tokio::select! {
            text = next_text(&mut body) => assert_eq!(text, ": keep-alive\n\n"),
            _ = refreshes => unreachable!(),
        }
        // No refresh for longer than the silence limit: unavailable.
        let text = next_text(&mut body).await;
        assert!(text.starts_with("event: unavailable\n"), "{text}");
    }
}
