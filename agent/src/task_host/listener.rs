//! The task host's socket: it accepts the agent container, and nobody in its own container.
//!
//! The socket sits in a volume the tasks container mounts too, so its own tasks could connect
//! and drive it. A peer's pid, as the kernel reports it (SO_PEERCRED), is translated into the
//! task host's PID namespace, and a process of another namespace — the agent container's —
//! shows as 0. Any other pid is a process of this container, a task: refused.

use super::host::Host;
use super::session;
use anyhow::Context as _;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::net::UnixListener;

pub async fn serve(host: Arc<Host>, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--socket {}: cannot create its directory", path.display()))?;
    }
    // A socket left by an earlier run of this container (it restarted): ours to replace.
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| {
                format!("--socket {}: cannot remove the old socket", path.display())
            })
        }
        _ => {}
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("--socket {}: cannot listen", path.display()))?;
    // The agent container may run as another user of the Pod's group (fsGroup).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    tracing::info!(socket = %path.display(), "waiting for the agent");
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                continue;
            }
        };
        match stream.peer_cred().map(|c| c.pid()) {
            Ok(Some(pid)) if pid != 0 => {
                tracing::warn!(pid, "refused a connection from a process of this container: only the agent container may drive the task host");
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell who connected; refused");
                continue;
            }
        }
        tokio::spawn(session::serve(host.clone(), stream));
    }
}
