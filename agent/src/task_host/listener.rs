//! The task host's socket: it accepts the agent container, and nobody in its own container.
//!
//! The name is bound before any task starts and held until this process (PID 1 of the tasks
//! container) ends, so no task can take it over (see [`TaskHostSocket`]). Tasks share the
//! Pod's network namespace and can connect to it, though: a peer's pid, as the kernel reports
//! it (SO_PEERCRED), is translated into the task host's PID namespace, and a process of another
//! namespace — the agent container's — shows as 0. Any other pid is a process of this
//! container, a task: refused.

use super::host::Host;
use super::session;
use crate::task_host_socket::TaskHostSocket;
use anyhow::Context as _;
use std::sync::Arc;

pub async fn serve(host: Arc<Host>, socket: &TaskHostSocket) -> anyhow::Result<()> {
    let listener = socket.bind().with_context(|| {
        format!(
            "--socket {socket}: cannot listen (in use: another task host runs in this network \
             namespace, or a process holds the name)"
        )
    })?;
    tracing::info!(%socket, "waiting for the agent");
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
