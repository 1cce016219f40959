//! The signal from the Sentinel subscription to the fetch loop: "fetch now", and whether the
//! subscription is up (then an idle agent may wait the longer subscribed interval, because it
//! will be woken when work is queued).

use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

#[derive(Default)]
pub struct Wake {
    subscribed: AtomicBool,
    fetch_now: Notify,
    queues_changed: Notify,
}

impl Wake {
    /// Whether a subscription is up now.
    pub fn subscribed(&self) -> bool {
        self.subscribed.load(Ordering::Acquire)
    }

    /// Records the subscription's state; returns whether it changed. Losing it wakes the fetch
    /// loop: whatever was queued meanwhile is fetched at once, and the loop goes back to the
    /// unsubscribed interval.
    pub fn set_subscribed(&self, up: bool) -> bool {
        let was = self.subscribed.swap(up, Ordering::AcqRel);
        if was && !up {
            self.fetch_now.notify_one();
        }
        was != up
    }

    /// Work may be waiting: the fetch loop asks at once (or right after its current fetch).
    pub fn fetch_now(&self) {
        self.fetch_now.notify_one();
    }

    /// Completes at the next [`Wake::fetch_now`] (at once if one came meanwhile).
    pub async fn woken(&self) {
        self.fetch_now.notified().await;
    }

    /// Airflow changed this worker's queues: subscribe to the new ones, and fetch from them.
    pub fn queues_changed(&self) {
        self.queues_changed.notify_one();
        self.fetch_now.notify_one();
    }

    /// Completes at the next [`Wake::queues_changed`].
    pub async fn queues_changed_notified(&self) {
        self.queues_changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    fn ready(f: impl Future<Output = ()>) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        std::pin::pin!(f).poll(&mut cx).is_ready()
    }

    #[test]
    fn losing_the_subscription_wakes_the_fetch_loop_and_gaining_it_does_not() {
        let wake = Wake::default();
        assert!(wake.set_subscribed(true));
        assert!(!ready(wake.woken()));
        assert!(!wake.set_subscribed(true));
        assert!(wake.set_subscribed(false));
        assert!(!wake.subscribed());
        assert!(ready(wake.woken()));
        assert!(!ready(wake.woken()), "once");
    }

    #[test]
    fn a_queue_change_resubscribes_and_fetches() {
        let wake = Wake::default();
        wake.queues_changed();
        assert!(ready(wake.queues_changed_notified()));
        assert!(ready(wake.woken()));
    }
}
