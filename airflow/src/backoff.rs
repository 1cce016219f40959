//! Capped exponential backoff with full jitter, the one retry policy of the project.
//!
//! Full jitter (a uniform delay between zero and the exponential bound) spreads the retries of
//! many workers that lost the api-server at the same moment, so they do not return in lockstep.

use rand::Rng;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            attempt: 0,
        }
    }

    /// The policy for calls to Airflow: 0.5 s doubling up to 30 s.
    pub fn for_airflow() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(30))
    }

    /// Upper bound of the next delay, before jitter.
    fn bound(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(20)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay to wait before the next attempt; each call widens the bound.
    pub fn next_delay(&mut self) -> Duration {
        let bound = self.bound();
        self.attempt = self.attempt.saturating_add(1);
        let millis = bound.as_millis() as u64;
        // Never zero: a retry loop must always yield some time to the server.
        Duration::from_millis(rand::rng().random_range(millis / 10..=millis.max(1)))
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stay_under_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut bounds = Vec::new();
        for _ in 0..10 {
            bounds.push(b.bound());
            let d = b.next_delay();
            assert!(d <= Duration::from_secs(2), "{d:?} above cap");
            assert!(
                d >= Duration::from_millis(10),
                "{d:?} below a tenth of the base"
            );
        }
        assert_eq!(bounds[0], Duration::from_millis(100));
        assert_eq!(bounds[1], Duration::from_millis(200));
        assert_eq!(bounds[4], Duration::from_millis(1600));
        assert_eq!(bounds[5], Duration::from_secs(2));
        assert_eq!(bounds[9], Duration::from_secs(2));
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for _ in 0..5 {
            b.next_delay();
        }
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(b.bound(), Duration::from_millis(100));
    }

    #[test]
    fn huge_attempt_counts_do_not_overflow() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        b.attempt = u32::MAX - 1;
        assert_eq!(b.bound(), Duration::from_secs(30));
        b.next_delay();
        b.next_delay();
    }
}
