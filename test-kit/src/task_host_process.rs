//! `astro-agent task-host --socket @NAME` as a worker Pod's tasks container runs it: optionally
//! in a PID namespace of its own (it accepts only peers from outside its namespace), killed with
//! everything in it when dropped. It shares the test's network namespace, and so its abstract
//! socket names: each test takes a name of its own.

use crate::agent_process::agent_binary;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

pub struct TaskHostProcess {
    /// `unshare` (which waits for the task host) or the task host itself.
    pub child: tokio::process::Child,
    pub log_path: PathBuf,
}

/// A socket name (`@...`) no other test uses.
pub fn unique_socket() -> String {
    format!(
        "@astro-agent-test/task-host-{}",
        uuid::Uuid::new_v4().simple()
    )
}

/// Whether a process of this network namespace listens on the abstract name `socket` (`@...`),
/// as the kernel lists them in /proc/net/unix.
pub fn is_listening(socket: &str) -> bool {
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split_whitespace().nth(7) == Some(socket))
}

/// Starts a task host listening on `socket` (`@NAME`), logging to `log_path`. With `own_pid_namespace`
/// it is PID 1 of a new PID namespace, as in a container (a user namespace too when this is
/// not root); `unshare --kill-child` makes it die with the returned process.
pub fn start_task_host(socket: &str, log_path: &Path, own_pid_namespace: bool) -> TaskHostProcess {
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

    /// Waits until it listens on `socket`.
    pub async fn listening(&self, socket: &str) {
        for _ in 0..1000 {
            if is_listening(socket) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "nothing listens on {socket}; task host log:\n{}",
            self.log()
        );
    }

    /// Kills it at once (with its namespace, and so every task in it), and waits for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}
