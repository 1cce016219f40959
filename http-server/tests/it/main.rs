//! The HTTP server's integration tests: one test binary, a module per subject
//! (`cargo test -p http-server --test it MODULE` runs one).
mod net_namespace;
mod peer_flood;
mod slow_clients;
