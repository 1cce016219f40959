//! The task host's command line.

use crate::task_host_socket::TaskHostSocket;
use std::os::fd::RawFd;

/// Runs Airflow tasks for an astro-agent that connects over an abstract Unix socket
#[derive(Debug, clap::Parser)]
#[command(name = "astro-agent task-host", version)]
pub struct TaskHostFlags {
    /// Listen for the agent on this abstract Unix socket name, in the network namespace both
    /// containers of the Pod share (held until this process ends: no task can take it)
    #[arg(
        long,
        value_name = "@NAME",
        required_unless_present = "fd",
        conflicts_with = "fd"
    )]
    socket: Option<TaskHostSocket>,

    /// Serve the one agent connected on this inherited descriptor (set by an agent that starts
    /// its task host itself)
    #[arg(long, value_name = "N", hide = true)]
    fd: Option<RawFd>,

    /// Log lines for people (text) or for log pipelines (json)
    #[arg(long, value_name = "FORMAT", value_enum, default_value = "text")]
    pub log_format: logging::LogFormat,
}

pub enum Connection {
    Socket(TaskHostSocket),
    Inherited(RawFd),
}

impl TaskHostFlags {
    pub fn connection(&self) -> Connection {
        match (&self.socket, self.fd) {
            (Some(socket), _) => Connection::Socket(socket.clone()),
            (None, Some(fd)) => Connection::Inherited(fd),
            (None, None) => unreachable!("clap requires one of them"),
        }
    }
}
