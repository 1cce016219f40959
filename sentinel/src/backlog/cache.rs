//! The per-queue backlog cache: the last value read for each queue, when it was read, and why
//! the latest attempt failed if it did.
//!
//! The refresh loop is the only writer; it publishes a new immutable [`Snapshot`] after every
//! refresh. Requests only clone an `Arc`, so answering KEDA never waits for Airflow; the
//! external scaler's streams [`subscribe`](BacklogCache::subscribe) to hear of each refresh.

use crate::schedule::windows::Expected;
use crate::sources::QueueBacklog;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use tokio::sync::watch;

/// One successful read of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub backlog: QueueBacklog,
    /// When it was read (monotonic, for ages).
    pub at: Instant,
    /// The same moment on the wall clock (for `updatedAt`).
    pub at_wall: SystemTime,
}

/// What the Sentinel knows about one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueEntry {
    /// The last successful read; kept when later refreshes fail, so its age can tell.
    pub last: Option<Reading>,
    /// Why the latest refresh of this queue failed; `None` after a success.
    pub last_error: Option<Arc<str>>,
}

/// The state of every configured queue at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    queues: HashMap<String, QueueEntry>,
    /// Pre-warm: each worker's expected slots for its scheduled runs (absent: none).
    expected: HashMap<String, Expected>,
    /// Task instances Airflow holds in `scheduled` per queue, as last read (absent: unknown).
    /// Never part of a backlog: no worker could take them.
    held: HashMap<String, u64>,
}

impl Snapshot {
    /// A snapshot that knows `queues` but holds no value for any of them yet.
    pub fn empty<'a>(queues: impl IntoIterator<Item = &'a String>) -> Self {
        Snapshot {
            queues: queues
                .into_iter()
                .map(|q| (q.clone(), QueueEntry::default()))
                .collect(),
            expected: HashMap::new(),
            held: HashMap::new(),
        }
    }

    /// A snapshot for `queues` that keeps what `previous` knew of those it had: after a
    /// configuration change the queues that stay are served at once, not after a refresh.
    pub fn keeping<'a>(previous: &Snapshot, queues: impl IntoIterator<Item = &'a String>) -> Self {
        Snapshot {
            queues: queues
                .into_iter()
                .map(|q| {
                    (
                        q.clone(),
                        previous.queues.get(q).cloned().unwrap_or_default(),
                    )
                })
                .collect(),
            expected: HashMap::new(),
            held: HashMap::new(),
        }
    }

    /// Task instances held in `scheduled` over `queues`; `None` unless every one was read.
    pub fn held(&self, queues: &[String]) -> Option<u64> {
        queues
            .iter()
            .map(|q| self.held.get(q).copied())
            .sum::<Option<u64>>()
    }

    /// Replaces the held counts with the last read; `None`: the read failed (all unknown).
    pub fn set_held(&mut self, held: Option<HashMap<String, u64>>) {
        self.held = held.unwrap_or_default();
    }

    /// `worker`'s expected slots from the schedule, if any window is open for it.
    pub fn expected(&self, worker: &str) -> Option<&Expected> {
        self.expected.get(worker)
    }

    /// Replaces every worker's expected slots (the pre-warm step after each refresh).
    pub fn set_expected(&mut self, expected: HashMap<String, Expected>) {
        self.expected = expected;
    }

    pub fn queue(&self, name: &str) -> Option<&QueueEntry> {
        self.queues.get(name)
    }

    pub fn queues(&self) -> impl Iterator<Item = (&String, &QueueEntry)> {
        self.queues.iter()
    }

    /// Records the outcome of one refresh of `queue` at `at`/`at_wall`.
    pub fn record(
        &mut self,
        queue: &str,
        outcome: Result<QueueBacklog, String>,
        at: Instant,
        at_wall: SystemTime,
    ) {
        let entry = self.queues.entry(queue.to_string()).or_default();
        match outcome {
            Ok(backlog) => {
                entry.last = Some(Reading {
                    backlog,
                    at,
                    at_wall,
                });
                entry.last_error = None;
            }
            // The last good value stays: it is still the truth until it is too old.
            Err(error) => entry.last_error = Some(error.into()),
        }
    }
}

/// The shared cache: one published snapshot, replaced whole by the refresh loop.
pub struct BacklogCache {
    current: watch::Sender<Arc<Snapshot>>,
}

impl BacklogCache {
    pub fn new(initial: Snapshot) -> Self {
        BacklogCache {
            current: watch::Sender::new(Arc::new(initial)),
        }
    }

    /// The latest snapshot; the lock is held only to clone an `Arc`.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.borrow().clone()
    }

    /// Replaces the snapshot and wakes every subscriber.
    pub fn publish(&self, snapshot: Snapshot) {
        self.current.send_replace(Arc::new(snapshot));
    }

    /// A receiver that sees each published snapshot (at least the latest one).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.current.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_keeps_the_last_value_and_remembers_why() {
        let mut s = Snapshot::empty(&["a".to_string()]);
        let t0 = Instant::now();
        let w0 = SystemTime::now();
        let counts = QueueBacklog {
            queued_tasks: 3,
            running_tasks: 2,
            ..QueueBacklog::default()
        };
        s.record("a", Ok(counts), t0, w0);
        s.record("a", Err("boom".into()), t0, w0);
        let e = s.queue("a").unwrap();
        assert_eq!(e.last.unwrap().backlog, counts);
        assert_eq!(e.last_error.as_deref(), Some("boom"));
        s.record("a", Ok(QueueBacklog::default()), t0, w0);
        assert_eq!(s.queue("a").unwrap().last_error, None);
    }

    #[test]
    fn publish_replaces_the_snapshot_readers_see() {
        let cache = BacklogCache::new(Snapshot::empty(&["a".to_string()]));
        let before = cache.snapshot();
        let mut next = (*before).clone();
        next.record(
            "a",
            Ok(QueueBacklog::default()),
            Instant::now(),
            SystemTime::now(),
        );
        cache.publish(next);
        assert!(before.queue("a").unwrap().last.is_none());
        assert!(cache.snapshot().queue("a").unwrap().last.is_some());
    }

    #[test]
    fn subscribers_hear_of_each_publication() {
        let cache = BacklogCache::new(Snapshot::empty(&["a".to_string()]));
        let mut rx = cache.subscribe();
        assert!(!rx.has_changed().unwrap());
        cache.publish(Snapshot::empty(&["a".to_string()]));
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert!(!rx.has_changed().unwrap());
    }
}
