//! At most one log line per period for a warning that can repeat without end.

use std::time::{Duration, Instant};

pub struct LogThrottle {
    every: Duration,
    last: Option<Instant>,
    left_out: u64,
}

impl LogThrottle {
    pub fn new(every: Duration) -> Self {
        LogThrottle {
            every,
            last: None,
            left_out: 0,
        }
    }

    /// `Some(how many were left out since the last line)` when this occurrence may be logged.
    pub fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(last) if now.duration_since(last) < self.every => {
                self.left_out += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.left_out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_first_then_counts_the_rest() {
        let mut throttle = LogThrottle::new(Duration::from_secs(3600));
        assert_eq!(throttle.ready(), Some(0));
        assert_eq!((0..1000).filter_map(|_| throttle.ready()).count(), 0);
        let mut every_time = LogThrottle::new(Duration::ZERO);
        assert_eq!(every_time.ready(), Some(0));
        assert_eq!(every_time.ready(), Some(0));
    }
}
