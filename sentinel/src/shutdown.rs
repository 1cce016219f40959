//! The signals that stop the Sentinel: SIGTERM (Kubernetes) and SIGINT (a terminal).

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Installed handlers for SIGTERM and SIGINT. Create it first thing, so that a signal that
/// arrives during start-up is not lost (nor kills the process with the default action).
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Completes on the first SIGTERM or SIGINT and returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
