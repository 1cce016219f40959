//! The task host's command line.

use std::os::fd::RawFd;
use std::path::PathBuf;

/// Runs Airflow tasks for an astro-agent that connects over a Unix socket
#[derive(Debug, clap::Parser)]
#[command(name = "astro-agent task-host", version)]
pub struct TaskHostFlags {
    /// Listen on this Unix socket for the agent (in a volume both containers mount)
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present = "fd",
        conflicts_with = "fd"
    )]
    socket: Option<PathBuf>,

    /// Serve the one agent connected on this inherited descriptor (set by an agent that starts
    /// its task host itself)
    #[arg(long, value_name = "N", hide = true)]
    fd: Option<RawFd>,

    /// Log lines for people (text) or for log pipelines (json)
    #[arg(long, value_name = "FORMAT", value_enum, default_value = "text")]
    pub log_format: logging::LogFormat,
}

pub enum Connection {
    Socket(PathBuf),
    Inherited(RawFd),
}

impl TaskHostFlags {
    pub fn connection(&self) -> Connection {
        match (&self.socket, self.fd) {
            (Some(path), _) => Connection::Socket(path.clone()),
            (None, Some(fd)) => Connection::Inherited(fd),
            (None, None) => unreachable!("clap requires one of them"),
        }
    }
}
