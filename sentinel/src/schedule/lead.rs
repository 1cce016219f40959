//! How long before a run's `run_after` the pool is asked to be up: the time a start from zero
//! takes (KEDA's activation, scheduling, the container, the agent's registration), plus a
//! margin for a slower start than usual.

use std::time::Duration;

/// A start from zero when this pool's own have not been measured: KEDA's polling, a Pod
/// scheduled and started from a cached image, the agent registered and the launcher ready.
pub const UNMEASURED_COLD_START: Duration = Duration::from_secs(20);
/// Added to the cold start: a start slower than the typical one still finishes in time.
pub const LEAD_MARGIN: Duration = Duration::from_secs(10);

/// The pre-warm lead of one pool: the configured one, else its typical cold start as measured
/// (`None` until measured) plus [`LEAD_MARGIN`].
pub fn pre_warm_lead(
    configured: Option<Duration>,
    measured_cold_start: Option<Duration>,
) -> Duration {
    configured.unwrap_or_else(|| {
        measured_cold_start
            .unwrap_or(UNMEASURED_COLD_START)
            .saturating_add(LEAD_MARGIN)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_wins_then_measured_then_the_default_each_plus_the_margin() {
        let s = Duration::from_secs;
        assert_eq!(pre_warm_lead(Some(s(7)), Some(s(40))), s(7));
        assert_eq!(pre_warm_lead(None, Some(s(4))), s(4) + LEAD_MARGIN);
        assert_eq!(
            pre_warm_lead(None, None),
            UNMEASURED_COLD_START + LEAD_MARGIN
        );
    }
}
