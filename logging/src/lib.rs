//! How both binaries log, to stderr: `text` for people (colour only on a terminal, never
//! escape codes in files and pipes) or `json`, one object per line, which is what log
//! pipelines on Kubernetes parse. `RUST_LOG` sets the level (default `info`). Refused flags
//! are one line too: [`flags`].

pub mod flags;

use std::io::IsTerminal;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber; call once, before anything logs.
pub fn init(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}
