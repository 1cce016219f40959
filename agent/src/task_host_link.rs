//! Reaching the task host: connect to its abstract socket name (a worker Pod's tasks container),
//! or start it as a child on a socket pair (anywhere else); then hello and its welcome.

use crate::frames::{self, Reader, Writer};
use crate::task_host_protocol::{
    DetectedVersions, FromHost, HostedTask, TaskSettings, ToHost, PROTOCOL,
};
use crate::task_host_socket::TaskHostSocket;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// The welcome may wait for the task host to probe its Python (an interpreter start on a busy
/// node) and, after a restart, for its start-up.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(180);

pub enum Link {
    /// A task host listening in another container.
    Socket(TaskHostSocket),
    /// Start `program task-host` with `env`, its whole environment.
    Child {
        program: PathBuf,
        env: Vec<(OsString, OsString)>,
        log_format: String,
    },
}

/// An established connection after the welcome.
pub struct Connection {
    pub events: Reader<OwnedReadHalf>,
    pub requests: Writer<OwnedWriteHalf>,
    pub versions: DetectedVersions,
    pub tasks: Vec<HostedTask>,
    /// The task host process, when the agent started it.
    pub child: Option<tokio::process::Child>,
}

impl Link {
    pub fn describe(&self) -> String {
        match self {
            Link::Socket(socket) => format!("the task host at {socket}"),
            Link::Child { .. } => "the task host the agent starts".to_string(),
        }
    }

    pub async fn connect(&self, settings: &TaskSettings) -> std::io::Result<Connection> {
        let (stream, child) = match self {
            Link::Socket(socket) => (socket.connect().await?, None),
            Link::Child {
                program,
                env,
                log_format,
            } => {
                let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
                let child = tokio::process::Command::new(program)
                    .args([
                        "task-host",
                        "--fd",
                        "0",
                        "--log-format",
                        log_format.as_str(),
                    ])
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::from(OwnedFd::from(theirs)))
                    .stdout(Stdio::null())
                    // Its own group: a Ctrl-C in the agent's terminal is the agent's to handle.
                    .process_group(0)
                    .spawn()?;
                ours.set_nonblocking(true)?;
                (UnixStream::from_std(ours)?, Some(child))
            }
        };
        let (read, write) = stream.into_split();
        let mut events = frames::reader(read);
        let mut requests = frames::writer(write);
        let hello = ToHost::Hello {
            protocol: PROTOCOL,
            settings: settings.clone(),
        };
        frames::send(&mut requests, &hello).await?;
        let (versions, tasks) = tokio::time::timeout(WELCOME_TIMEOUT, welcome(&mut events))
            .await
            .map_err(|_| {
                std::io::Error::other(format!("no welcome within {WELCOME_TIMEOUT:?}"))
            })??;
        Ok(Connection {
            events,
            requests,
            versions,
            tasks,
            child,
        })
    }
}

/// The welcome and the tasks it announces, one frame each.
async fn welcome(
    events: &mut Reader<OwnedReadHalf>,
) -> std::io::Result<(DetectedVersions, Vec<HostedTask>)> {
    let (versions, count) = match frames::receive::<FromHost, _>(events).await? {
        FromHost::Welcome {
            protocol: PROTOCOL,
            versions,
            tasks,
        } => (versions, tasks),
        FromHost::Welcome { protocol, .. } => {
            return Err(std::io::Error::other(format!(
                "welcomed with protocol {protocol}, not this agent's {PROTOCOL}: run the same astro-agent version in both containers"
            )))
        }
        FromHost::Refused { reason } => {
            return Err(std::io::Error::other(format!("refused: {reason}")))
        }
        other => {
            return Err(std::io::Error::other(format!(
                "answered hello with a {} message",
                other.kind()
            )))
        }
    };
    let mut tasks = Vec::new();
    for _ in 0..count {
        match frames::receive::<FromHost, _>(events).await? {
            FromHost::Hosted { task } => tasks.push(task),
            other => {
                return Err(std::io::Error::other(format!(
                    "a {} message among the tasks its welcome announced",
                    other.kind()
                )))
            }
        }
    }
    Ok((versions, tasks))
}
