//! The agent's integration tests: one test binary, a module per subject (one link
//! instead of one per file; `cargo test -p astro-agent --test it MODULE` runs one).
mod admin_server_limits;
mod agent_behaviour;
mod recovery;
mod secrets_in_logs;
mod sentinel_wake;
mod task_host;
mod version_negotiation;
