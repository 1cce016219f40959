//! Airflow can change a running worker's concurrency and queues (edge3's
//! `set-worker-concurrency`, `add-worker-queues`, ...), and the agent obeys. The autoscaler
//! does not know: it still divides the backlog by the configured `--sync-slots` and counts the
//! worker for its configured queues. This says so, once per change, in the log and in
//! `astro_agent_settings_overridden{setting}`, so that the drift is seen rather than felt as a
//! pool that scales wrongly.

use prometheus::IntGaugeVec;
use std::sync::Mutex;

pub struct SettingsDrift {
    configured_slots: u32,
    configured_queues: Vec<String>,
    gauge: IntGaugeVec,
    seen: Mutex<Seen>,
}

/// What the last check found overridden.
#[derive(Default)]
struct Seen {
    slots: Option<u32>,
    queues: Option<Vec<String>>,
}

impl SettingsDrift {
    pub fn new(configured_slots: u32, configured_queues: Vec<String>, gauge: IntGaugeVec) -> Self {
        for setting in ["concurrency", "queues"] {
            gauge.with_label_values(&[setting]).set(0);
        }
        SettingsDrift {
            configured_slots,
            configured_queues,
            gauge,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Compares what the worker now runs with against its configuration (after each
    /// heartbeat answer has been applied).
    pub fn check(&self, slots: u32, queues: &[String]) {
        let mut seen = self.seen.lock().unwrap();
        let slots_overridden = (slots != self.configured_slots).then_some(slots);
        if slots_overridden != seen.slots {
            match slots_overridden {
                Some(slots) => tracing::warn!(
                    slots,
                    configured = self.configured_slots,
                    "Airflow set this worker's concurrency to {slots}; the autoscaler still assumes \
                     {} slots per worker (syncSlots)",
                    self.configured_slots
                ),
                None => tracing::info!(
                    slots,
                    "concurrency back at its configured {slots} slots"
                ),
            }
            seen.slots = slots_overridden;
        }
        let queues_overridden = (queues != self.configured_queues).then(|| queues.to_vec());
        if queues_overridden != seen.queues {
            match &queues_overridden {
                Some(queues) => tracing::warn!(
                    ?queues,
                    configured = ?self.configured_queues,
                    "Airflow changed this worker's queues; the autoscaler still counts it for its \
                     configured queues"
                ),
                None => tracing::info!(?queues, "queues back at their configured list"),
            }
            seen.queues = queues_overridden;
        }
        self.gauge
            .with_label_values(&["concurrency"])
            .set(i64::from(seen.slots.is_some()));
        self.gauge
            .with_label_values(&["queues"])
            .set(i64::from(seen.queues.is_some()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    fn drift() -> (SettingsDrift, IntGaugeVec) {
        let gauge = IntGaugeVec::new(Opts::new("overridden", "test"), &["setting"]).unwrap();
        (
            SettingsDrift::new(16, vec!["default".into()], gauge.clone()),
            gauge,
        )
    }

    fn values(gauge: &IntGaugeVec) -> (i64, i64) {
        (
            gauge.with_label_values(&["concurrency"]).get(),
            gauge.with_label_values(&["queues"]).get(),
        )
    }

    #[test]
    fn configured_settings_are_not_overridden() {
        let (drift, gauge) = drift();
        drift.check(16, &["default".into()]);
        assert_eq!(values(&gauge), (0, 0));
    }

    #[test]
    fn airflow_changing_concurrency_or_queues_is_reported_until_it_changes_back() {
        let (drift, gauge) = drift();
        drift.check(8, &["default".into()]);
        assert_eq!(values(&gauge), (1, 0));
        drift.check(8, &["default".into(), "gpu".into()]);
        assert_eq!(values(&gauge), (1, 1));
        drift.check(16, &["default".into()]);
        assert_eq!(values(&gauge), (0, 0));
    }
}
