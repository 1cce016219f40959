//! Capped exponential backoff with full jitter, the one retry policy of the project.
//!
//! Full jitter (a uniform delay between zero and the exponential bound) spreads the retries of
//! many workers that lost the api-server at the same moment, so they do not return in lockstep.

use rand::Rng;
use std::future::Future;
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

    /// The same policy with no delay longer than `limit`.
    pub fn at_most(mut self, limit: Duration) -> Self {
        self.cap = self.cap.min(limit);
        self
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

/// Runs `op` until it answers `Ok`, sleeping `backoff`'s next delay after each `Err`; `None`
/// when `stop` completes during a sleep. `op` answers `Ok` for every outcome that ends the
/// attempts (a success, or a failure that retrying cannot fix), and `Err(say)` otherwise: `say`
/// gets the delay before the next attempt, so that the warning can tell when that is.
pub async fn retry<T, Say, Fut>(
    mut backoff: Backoff,
    stop: impl Future<Output = ()>,
    mut op: impl FnMut() -> Fut,
) -> Option<T>
where
    Say: FnOnce(Duration),
    Fut: Future<Output = Result<T, Say>>,
{
    let mut stop = std::pin::pin!(stop);
    loop {
        let say = match op().await {
            Ok(done) => return Some(done),
            Err(say) => say,
        };
        let delay = backoff.next_delay();
        say(delay);
        tokio::select! {
            _ = &mut stop => return None,
            _ = tokio::time::sleep(delay) => {}
        }
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

    #[tokio::test(start_paused = true)]
    async fn retry_tries_again_until_ok_and_says_each_delay() {
        let attempts = std::cell::Cell::new(0);
        let said = std::cell::Cell::new(0);
        let got = retry(
            Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
            std::future::pending(),
            || {
                attempts.set(attempts.get() + 1);
                let n = attempts.get();
                let said = &said;
                async move {
                    if n < 3 {
                        Err(move |_: Duration| said.set(said.get() + 1))
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(got, Some(3));
        assert_eq!(said.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_ends_when_stopped_during_a_sleep() {
        // Stops after a minute, long after the first delays: the attempts never succeed.
        let stop = tokio::time::sleep(Duration::from_secs(60));
        let got: Option<()> = retry(Backoff::for_airflow(), stop, || async {
            Err(|_: Duration| {})
        })
        .await;
        assert_eq!(got, None);
    }
}
