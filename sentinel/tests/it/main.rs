//! The Sentinel's integration tests: one test binary, a module per subject (one link
//! instead of one per file; `cargo test -p astro-sentinel --test it MODULE` runs one).
mod airflow_api_source;
mod binary;
mod common;
mod config_fuzz;
mod config_reload;
mod ensure_secrets;
mod external_scaler_limits;
mod external_scaler_tls;
mod history_api;
mod history_file_lock;
mod history_replicas;
mod keda_api;
mod kubernetes_users;
mod pre_warm;
mod queue_events;
mod secrets_in_logs;
mod staleness;
mod token_review;
mod token_review_flood;
mod token_review_tls;
mod ui_page;
