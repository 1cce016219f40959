//! What the workspace's tests share, so that each crate's tests hold only their own cases:
//! serving a handler on a free loopback port, waiting for a condition, raw HTTP requests and
//! answers, temp folders, and fakes of the servers the binaries talk to (the Edge Worker API,
//! Airflow's REST API, Kubernetes) with the clients that call them as KEDA does.
//!
//! A library rather than a `tests/common` module: each test binary uses a different part,
//! and what one binary leaves unused is not dead code here.

pub mod agent_process;
pub mod child_guard;
pub mod eventually;
pub mod fake_edge_api;
pub mod fake_kubernetes;
pub mod fake_rest_api;
pub mod keda;
pub mod port;
pub mod raw_http;
pub mod sentinel_process;
pub mod server;
pub mod task_host_process;
pub mod temp_dir;
pub mod test_certificates;

pub use child_guard::ChildGuard;
pub use eventually::eventually;
pub use port::free_port;
pub use raw_http::{parse_answer, raw_request, Answer};
pub use server::{json_response, serve, TestServer};
pub use temp_dir::TempDir;
