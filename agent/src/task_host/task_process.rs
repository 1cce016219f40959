//! A running task process: waiting for its end, stopping it (its whole process group, SIGTERM
//! then SIGKILL), and the tail of its supervisor's output for the task log.

use super::reaper::Reaper;
use super::task_output::TaskOutput;
use crate::config::LaunchMode;
pub use crate::task_host_protocol::KILL_GRACE;
use nix::sys::signal::Signal;
use std::process::ExitStatus;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// How a task process ended.
#[derive(Debug)]
pub enum Exit {
    /// It ended by itself.
    Finished(ExitStatus),
    /// The agent stopped it (second signal or drain deadline).
    Killed(ExitStatus),
}

/// A task process the agent started or adopted.
pub struct TaskProcess {
    pid: i32,
    launched_by: LaunchMode,
    exit: oneshot::Receiver<ExitStatus>,
    reaper: &'static Reaper,
    /// Read while it runs: a supervisor that fills the link would otherwise block.
    output: TaskOutput,
}

impl TaskProcess {
    /// `exit` delivers the status of `pid`, a process `reaper` watches.
    pub fn new(
        pid: i32,
        launched_by: LaunchMode,
        exit: oneshot::Receiver<ExitStatus>,
        reaper: &'static Reaper,
        output: TaskOutput,
    ) -> Self {
        TaskProcess {
            pid,
            launched_by,
            exit,
            reaper,
            output,
        }
    }

    /// What started the task: `Prefork` when the launcher forked it.
    pub fn launched_by(&self) -> LaunchMode {
        self.launched_by
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Its exit status, reading its output meanwhile.
    async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        let status = loop {
            tokio::select! {
                status = &mut self.exit => break status,
                () = self.output.read_some() => {}
            }
        };
        self.output.read_arrived();
        status.map_err(|_| std::io::Error::other("the reaper stopped before the task ended"))
    }

    /// Waits for the process to end; when `kill` fires first, SIGTERMs its process group
    /// (Airflow's supervisor then marks the task failed, so it can be retried), and SIGKILLs
    /// it after [`KILL_GRACE`].
    pub async fn wait(&mut self, kill: &CancellationToken) -> std::io::Result<Exit> {
        tokio::select! {
            status = self.exited() => return status.map(Exit::Finished),
            _ = kill.cancelled() => {}
        }
        self.signal(Signal::SIGTERM);
        match tokio::time::timeout(KILL_GRACE, self.exited()).await {
            Ok(status) => status.map(Exit::Killed),
            Err(_) => {
                self.signal(Signal::SIGKILL);
                self.exited().await.map(Exit::Killed)
            }
        }
    }

    /// Ends it at once: its start failed half-way.
    pub fn kill(&self) {
        self.signal(Signal::SIGKILL);
    }

    fn signal(&self, signal: Signal) {
        if !self.reaper.signal_group(self.pid, signal) {
            tracing::debug!(pid = self.pid, %signal, "process group already gone");
        }
    }

    /// The last bytes the supervisor printed (its own errors land there, not in the task log).
    pub fn output_tail(&self, max: usize) -> String {
        self.output.tail(max)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::task_spawner::tests::{fake_python, fresh_spawner};
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn exit_status_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(dir.path());
        let spawner = fresh_spawner(dir.path(), &python, "exit 3");
        let mut p = spawner.spawn(&serde_json::json!({})).await.unwrap();
        match p.wait(&CancellationToken::new()).await.unwrap() {
            Exit::Finished(s) => assert_eq!(s.code(), Some(3)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn kill_terminates_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        // The "supervisor" forks a grandchild, as the real one forks the task.
        let grandchild_pid = dir.path().join("grandchild.pid");
        let action = format!("sleep 300 & echo $! > {}; wait", grandchild_pid.display());
        let python = fake_python(dir.path());
        let spawner = fresh_spawner(dir.path(), &python, &action);
        let mut p = spawner.spawn(&serde_json::json!({})).await.unwrap();
        let gc: i32 = loop {
            match std::fs::read_to_string(&grandchild_pid).map(|s| s.trim().parse()) {
                Ok(Ok(pid)) => break pid,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let kill = CancellationToken::new();
        kill.cancel();
        let exit = tokio::time::timeout(Duration::from_secs(5), p.wait(&kill))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(exit, Exit::Killed(_)));
        assert!(gone(gc).await, "grandchild {gc} survived the kill");
    }

    /// The process is gone or a zombie (its parent may reap it a little later).
    pub(crate) async fn gone(pid: i32) -> bool {
        for _ in 0..300 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}
