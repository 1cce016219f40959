//! The queue-event stream's metrics: how many agents hold it, and what it sent them.

use super::{counter_vec, register};
use prometheus::{IntCounterVec, IntGauge, Registry};

#[derive(Clone)]
pub struct QueueEventMetrics {
    /// Streams open now.
    pub subscribers: IntGauge,
    /// Events sent, by event (`subscribed`, `rose`, `unavailable`, `reconnect`, `keep_alive`).
    pub sent: IntCounterVec,
}

impl QueueEventMetrics {
    pub fn register(r: &Registry) -> Self {
        QueueEventMetrics {
            subscribers: register(
                r,
                IntGauge::new(
                    "astro_sentinel_queue_event_subscribers",
                    "Queue-event streams open now (idle agents waiting to be woken).",
                ),
            ),
            sent: counter_vec(
                r,
                "astro_sentinel_queue_events_sent_total",
                "Events sent on queue-event streams, by event: subscribed (the state on connect), rose (new work on a subscribed queue), unavailable, reconnect, keep_alive.",
                &["event"],
            ),
        }
    }
}
