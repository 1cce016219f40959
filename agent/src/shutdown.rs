//! Signals: the first SIGTERM or SIGINT starts a drain, the second stops the tasks.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Installs the handlers now (so a signal that arrives during start-up is not lost) and
/// watches for signals in the background.
pub fn watch(drain: CancellationToken, kill: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(
            "{name}: draining — no new jobs; running tasks finish; send it again to stop them"
        );
        drain.cancel();
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::warn!("second {name}: stopping running tasks");
        kill.cancel();
    });
    Ok(())
}
