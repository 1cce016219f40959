//! The Airflow client's integration tests: one test binary, a module per subject
//! (`cargo test -p airflow --test it MODULE` runs one).
mod edge_answer_fuzz;
mod rest_api;
