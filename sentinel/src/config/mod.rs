//! What the Sentinel runs with, in two layers: the configuration [`file`](mod@file) (YAML:
//! workers, source, auth, intervals, the pool view, the history, [`pre_warm`], the agents' queue events) and the command-line
//! [`flags`] (each also an `ASTRO_SENTINEL_<FLAG>` variable: addresses, secrets, access to the
//! Kubernetes API), which [`flags::Settings`] combines with the file. Secrets are never in the
//! file.

pub mod file;
pub mod flags;
pub mod kubernetes_access;
pub mod pre_warm;
pub mod queue_events;
pub mod reload;
pub mod worker_labels;

/// A configuration problem, described in one line that names the worker and/or field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    pub fn new(message: impl Into<String>) -> Self {
        // One line, whatever the underlying parser produced.
        let message: String = message.into();
        ConfigError(message.split_whitespace().collect::<Vec<_>>().join(" "))
    }
}
