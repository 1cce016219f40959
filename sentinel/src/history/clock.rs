//! The wall clock the history stamps samples with. Injected so that tests can drive days of
//! history in milliseconds; the Sentinel itself uses [`SystemClock`].

use std::time::{SystemTime, UNIX_EPOCH};

pub trait WallClock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn unix_ms_counts_from_the_epoch() {
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1234)), 1234);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }
}
