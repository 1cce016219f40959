//! What the agent spends between its drain deadline (or a second signal) and its exit, all of it
//! inside `--drain-margin`: in a Pod the kubelet's SIGKILL comes at the end of the grace period,
//! and the deadline is the grace period minus the margin, so whatever of this is still running
//! then (a final task state, the offline report) would be cut.

use crate::task_host_protocol::KILL_GRACE;
use std::time::Duration;

/// The last heartbeat (`offline`), so Airflow frees the worker's name at once; past it Airflow
/// times the worker out instead, which is only slower.
pub const OFFLINE_REPORT_GRACE: Duration = Duration::from_secs(10);

/// The admin server's drain (`http_server::Limits::drain_timeout`) and the process's exit.
pub const EXIT_GRACE: Duration = Duration::from_secs(5);

/// The least time the stopped tasks' final states and logs get to reach Airflow once the tasks
/// have exited; a slow API server takes seconds per request.
pub const MIN_REPORT_GRACE: Duration = Duration::from_secs(10);

/// The smallest margin that holds all of the above. The chart refuses a smaller
/// `drainMarginSeconds` with the same figure.
pub const MIN_DRAIN_MARGIN: Duration = KILL_GRACE
    .saturating_add(MIN_REPORT_GRACE)
    .saturating_add(OFFLINE_REPORT_GRACE)
    .saturating_add(EXIT_GRACE);

/// The margin shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopBudget {
    /// From the moment tasks are told to stop until every job has exited and been reported:
    /// [`KILL_GRACE`] for the tasks, the rest for their reports.
    pub stop_and_report: Duration,
    pub report_offline: Duration,
}

impl StopBudget {
    /// The budget inside `margin`, or why it cannot hold the minimum.
    pub fn within(margin: Duration) -> Result<Self, String> {
        if margin < MIN_DRAIN_MARGIN {
            return Err(format!(
                "{} is too short: after the drain deadline the agent needs {}s to stop tasks, \
                 at least {}s for their final reports, {}s to report offline and {}s to exit \
                 (at least {} in all)",
                humantime::format_duration(margin),
                KILL_GRACE.as_secs(),
                MIN_REPORT_GRACE.as_secs(),
                OFFLINE_REPORT_GRACE.as_secs(),
                EXIT_GRACE.as_secs(),
                humantime::format_duration(MIN_DRAIN_MARGIN),
            ));
        }
        Ok(StopBudget {
            stop_and_report: margin - OFFLINE_REPORT_GRACE - EXIT_GRACE,
            report_offline: OFFLINE_REPORT_GRACE,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_budget_fits_in_the_margin() {
        for secs in [35, 36, 60, 600] {
            let margin = Duration::from_secs(secs);
            let budget = StopBudget::within(margin).unwrap();
            assert!(budget.stop_and_report >= KILL_GRACE + MIN_REPORT_GRACE);
            assert_eq!(
                budget.stop_and_report + budget.report_offline + EXIT_GRACE,
                margin
            );
        }
    }

    #[test]
    fn a_margin_too_short_for_the_reports_is_refused() {
        assert_eq!(MIN_DRAIN_MARGIN, Duration::from_secs(35));
        let e = StopBudget::within(Duration::from_secs(34)).unwrap_err();
        assert!(e.contains("34s is too short"), "{e}");
        assert!(e.contains("at least 35s in all"), "{e}");
    }
}
