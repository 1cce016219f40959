//! `astro-agent task-host --socket` as a worker Pod's tasks container runs it: optionally in a
//! PID namespace of its own (it accepts only peers from outside its namespace), killed with
//! everything in it when dropped.

use crate::agent_process::agent_binary;
use std::path::{Path, PathBuf};
use std::process::Stdio;

pub struct TaskHostProcess {
    /// `unshare` (which waits for the task host) or the task host itself.
    pub child: tokio::process::Child,
    pub log_path: PathBuf,
}

/// Starts a task host listening on `socket`, logging to `log_path`. With `own_pid_namespace`
/// it is PID 1 of a new PID namespace, as in a container (a user namespace too when this is
/// not root); `unshare --kill-child` makes it die with the returned process.
pub fn start_task_host(socket: &Path, log_path: &Path, own_pid_namespace: bool) -> TaskHostProcess {
    let binary = agent_binary();
    let mut cmd = if own_pid_namespace {
        let mut cmd = tokio::process::Command::new("unshare");
        if !nix::unistd::geteuid().is_root() {
            cmd.args(["--user", "--map-root-user"]);
        }
        cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
            .arg(binary);
        cmd
    } else {
        tokio::process::Command::new(binary)
    };
    cmd.arg("task-host")
        .arg("--socket")
        .arg(socket)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log_path).unwrap())
        .kill_on_drop(true);
    TaskHostProcess {
        child: cmd.spawn().expect("starting the task host"),
        log_path: log_path.to_path_buf(),
    }
}

impl TaskHostProcess {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Kills it at once (with its namespace, and so every task in it), and waits for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}
