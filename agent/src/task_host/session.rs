//! One agent connection: hello first, then requests in, events out, until either side ends.

use super::host::Host;
use crate::frames;
use crate::task_host_protocol::{
    DetectedVersions, FromHost, HostedTask, TaskSignal, ToHost, PROTOCOL,
};
use nix::sys::signal::Signal;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves one agent until the connection ends or another agent takes over.
pub async fn serve(host: Arc<Host>, stream: UnixStream) {
    let (read, write) = stream.into_split();
    let mut requests = frames::reader(read);
    let mut events = frames::writer(write);
    let settings = match tokio::time::timeout(
        HELLO_TIMEOUT,
        frames::receive::<ToHost, _>(&mut requests),
    )
    .await
    {
        Ok(Ok(ToHost::Hello { protocol, settings })) if protocol == PROTOCOL => settings,
        Ok(Ok(ToHost::Hello { protocol, .. })) => {
            let reason = format!("protocol {protocol} is not this task host's {PROTOCOL}: run the same astro-agent version in both containers");
            tracing::error!("refused an agent: {reason}");
            let _ = frames::send(&mut events, &FromHost::Refused { reason }).await;
            return;
        }
        other => {
            tracing::warn!(
                ?other,
                "a connection that did not start with hello; closing it"
            );
            return;
        }
    };
    let (outbox, mut pending) = mpsc::unbounded_channel();
    let (versions, tasks, connection) = match host.hello(settings, outbox).await {
        Ok(welcome) => welcome,
        Err(reason) => {
            tracing::error!("refused an agent: {reason}");
            let _ = frames::send(&mut events, &FromHost::Refused { reason }).await;
            return;
        }
    };
    tracing::info!(tasks = tasks.len(), "an agent connected");
    if let Err(e) = welcome(&mut events, versions, tasks).await {
        tracing::warn!(error = %e, "cannot welcome the agent");
        host.detach(connection);
        return;
    }
    loop {
        tokio::select! {
            request = frames::receive::<ToHost, _>(&mut requests) => match request {
                Ok(ToHost::Start { id, job, workload }) => {
                    // Not awaited here: a fresh interpreter takes a while to take its task,
                    // and signals for other tasks must not wait for it.
                    tokio::spawn(host.clone().start(id, job, workload));
                }
                Ok(ToHost::Signal { id, signal }) => host.signal(&id, match signal {
                    TaskSignal::Term => Signal::SIGTERM,
                    TaskSignal::Kill => Signal::SIGKILL,
                }),
                Ok(ToHost::Release { id }) => host.release(&id),
                Ok(ToHost::Hello { .. }) => {
                    tracing::warn!("a second hello on one connection; closing it");
                    break;
                }
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::UnexpectedEof {
                        tracing::warn!(error = %e, "the agent's connection failed");
                    }
                    break;
                }
            },
            event = pending.recv() => match event {
                Some(event) => {
                    if let Err(e) = frames::send(&mut events, &event).await {
                        tracing::warn!(error = %e, "cannot write to the agent");
                        break;
                    }
                }
                // Another agent connected: events go there now.
                None => break,
            },
        }
    }
    host.detach(connection);
    tracing::info!("the agent disconnected");
}

/// The welcome, then each task in a frame of its own: a frame holds one job and one bounded
/// output tail, whatever number of tasks an agent comes back to.
async fn welcome(
    events: &mut frames::Writer<OwnedWriteHalf>,
    versions: DetectedVersions,
    tasks: Vec<HostedTask>,
) -> std::io::Result<()> {
    let count = u32::try_from(tasks.len()).map_err(std::io::Error::other)?;
    let welcome = FromHost::Welcome {
        protocol: PROTOCOL,
        versions,
        tasks: count,
    };
    frames::send(events, &welcome).await?;
    for task in tasks {
        frames::send(events, &FromHost::Hosted { task }).await?;
    }
    Ok(())
}
