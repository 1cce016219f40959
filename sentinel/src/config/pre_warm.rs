//! The pre-warm settings of the configuration file: per worker `preWarm: {enabled, lead,
//! maxSlots}` and, at the top, `schedule: {readInterval}` (how often Airflow's schedule is
//! read). Pre-warm is on unless a worker says `enabled: false`.

use super::ConfigError;
use serde::Deserialize;
use std::collections::HashMap;
use std::time::Duration;

/// The schedule reader's cadence and each worker's pre-warm settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// How often the DAGs' next runs are read: the schedule changes rarely.
    pub read_interval: Duration,
    /// By worker name; a worker missing here pre-warms with the defaults.
    pub workers: HashMap<String, PreWarmConfig>,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            read_interval: DEFAULT_READ_INTERVAL,
            workers: HashMap::new(),
        }
    }
}

impl ScheduleConfig {
    /// `worker`'s settings (the defaults when the file says nothing).
    pub fn for_worker(&self, worker: &str) -> PreWarmConfig {
        self.workers.get(worker).copied().unwrap_or_default()
    }
}

/// One worker's pre-warm settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreWarmConfig {
    pub enabled: bool,
    /// How long before a run's `run_after` the pool is asked to be up; `None`: the pool's
    /// cold start plus a margin (see `schedule::lead`).
    pub lead: Option<Duration>,
    /// The most slots pre-warm asks for at once; `None`: up to `maxReplicas × syncSlots`.
    pub max_slots: Option<u32>,
}

impl Default for PreWarmConfig {
    fn default() -> Self {
        PreWarmConfig {
            enabled: true,
            lead: None,
            max_slots: None,
        }
    }
}

pub const DEFAULT_READ_INTERVAL: Duration = Duration::from_secs(60);
/// Below this the reader would cost the api-server more than the schedule is worth.
pub const MIN_READ_INTERVAL: Duration = Duration::from_secs(5);
/// A lead longer than this keeps workers idle for longer than any cold start takes.
pub const MAX_LEAD: Duration = Duration::from_secs(3600);

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawSchedule {
    #[serde(default, with = "humantime_serde")]
    read_interval: Option<Duration>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawPreWarm {
    enabled: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    lead: Option<Duration>,
    max_slots: Option<u32>,
}

pub(super) fn read_interval(raw: Option<RawSchedule>) -> Result<Duration, ConfigError> {
    let interval = raw
        .unwrap_or_default()
        .read_interval
        .unwrap_or(DEFAULT_READ_INTERVAL);
    if interval < MIN_READ_INTERVAL {
        return Err(ConfigError::new(format!(
            "schedule.readInterval: must be at least {}, got {}",
            humantime::format_duration(MIN_READ_INTERVAL),
            humantime::format_duration(interval)
        )));
    }
    Ok(interval)
}

/// Checks one worker's `preWarm`; `fail` prefixes the message with the worker.
pub(super) fn validate(
    raw: Option<RawPreWarm>,
    fail: impl Fn(String) -> ConfigError,
) -> Result<PreWarmConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    if let Some(lead) = raw.lead {
        if lead.is_zero() || lead > MAX_LEAD {
            return Err(fail(format!(
                "preWarm.lead: must be between 1s and {}, got {}",
                humantime::format_duration(MAX_LEAD),
                humantime::format_duration(lead)
            )));
        }
    }
    if raw.max_slots == Some(0) {
        return Err(fail(
            "preWarm.maxSlots: must be at least 1 (to turn pre-warm off, set preWarm.enabled: false)"
                .into(),
        ));
    }
    Ok(PreWarmConfig {
        enabled: raw.enabled.unwrap_or(true),
        lead: raw.lead,
        max_slots: raw.max_slots,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::file::Config;
    use std::time::Duration;

    const BASE: &str = "
source: {type: airflow-api, airflowApi: {url: 'http://airflow:8080'}}
auth: {disabled: true}
";

    fn parse(extra: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}{extra}")).map_err(|e| e.0)
    }

    #[test]
    fn on_by_default_and_per_worker_settings_are_read() {
        let c = parse(
            "schedule: {readInterval: 10s}
workers:
  - {name: a, queues: [q]}
  - {name: b, queues: [q], preWarm: {enabled: false}}
  - {name: c, queues: [q], preWarm: {lead: 45s, maxSlots: 8}}
",
        )
        .unwrap();
        assert_eq!(c.schedule.read_interval, Duration::from_secs(10));
        assert!(c.schedule.for_worker("a").enabled);
        assert!(!c.schedule.for_worker("b").enabled);
        let custom = c.schedule.for_worker("c");
        assert_eq!(
            (custom.lead, custom.max_slots),
            (Some(Duration::from_secs(45)), Some(8))
        );
        assert_eq!(
            parse("workers: []").unwrap().schedule.read_interval,
            super::DEFAULT_READ_INTERVAL
        );
    }

    #[test]
    fn bad_values_name_the_worker_and_field() {
        let err = |w: &str| parse(&format!("workers:\n  - {w}\n")).unwrap_err();
        assert_eq!(
            err("{name: a, queues: [q], preWarm: {maxSlots: 0}}"),
            "worker \"a\": preWarm.maxSlots: must be at least 1 (to turn pre-warm off, set preWarm.enabled: false)"
        );
        assert!(err("{name: a, queues: [q], preWarm: {lead: 0s}}")
            .starts_with("worker \"a\": preWarm.lead: must be between 1s and 1h"));
        assert!(err("{name: a, queues: [q], preWarm: {leed: 5s}}")
            .starts_with("worker \"a\": preWarm.leed: unknown field `leed`"));
        assert_eq!(
            parse("schedule: {readInterval: 1s}").unwrap_err(),
            "schedule.readInterval: must be at least 5s, got 1s"
        );
    }
}
