//! How soon a failed watch of the workers' namespace tries again. kube-runtime's default backs
//! off up to 30 s (with jitter), which after an API server outage left the pool view unknown
//! for most of a minute once the API server was back. The Sentinel holds three watches: retrying
//! every few seconds costs the API server nothing next to its other clients, and the view is
//! back within seconds of it.

use kube::runtime::utils::Backoff;
use std::time::Duration;

const FIRST: Duration = Duration::from_millis(500);
const LONGEST: Duration = Duration::from_secs(4);

/// 0.5 s, doubling up to 4 s; back to 0.5 s once the watch has delivered again.
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.next;
        self.next = (self.next * 2).min(LONGEST);
        Some(wait)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_starts_over_after_a_reset() {
        let mut backoff = WatchBackoff::default();
        let waits: Vec<u128> = backoff.by_ref().take(6).map(|d| d.as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 4000, 4000]);
        backoff.reset();
        assert_eq!(backoff.next(), Some(FIRST));
    }
}
