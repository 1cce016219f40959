//! Waiting for task processes the agent did not spawn itself.
//!
//! Tasks started by the pre-forked launcher are its grandchildren. The agent makes itself a
//! *child subreaper*, so when the launcher's intermediate process exits the task is re-parented
//! to the agent, which can then `waitpid` it like its own child — and still learns the task's
//! exit status if the launcher dies. Only pids registered here are waited for, each by its own
//! pid: tokio reaps the children it spawned itself the same way, so the two never steal each
//! other's exit statuses.

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

pub struct Reaper {
    watched: Mutex<HashMap<i32, oneshot::Sender<ExitStatus>>>,
}

/// Whether a process with this pid exists (a zombie included).
fn alive(pid: i32) -> bool {
    !matches!(
        nix::sys::signal::kill(Pid::from_raw(pid), None),
        Err(Errno::ESRCH)
    )
}

impl Reaper {
    /// Becomes a child subreaper and starts reaping on SIGCHLD.
    pub fn install() -> std::io::Result<Arc<Reaper>> {
        nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
        let mut sigchld = signal(SignalKind::child())?;
        let reaper = Arc::new(Reaper {
            watched: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&reaper);
        tokio::spawn(async move {
            while sigchld.recv().await.is_some() {
                match weak.upgrade() {
                    Some(reaper) => reaper.reap(),
                    None => return,
                }
            }
        });
        Ok(reaper)
    }

    /// The exit status of `pid`, which must be (or become) a child of this process.
    pub fn watch(&self, pid: i32) -> oneshot::Receiver<ExitStatus> {
        let (tx, rx) = oneshot::channel();
        self.watched.lock().unwrap().insert(pid, tx);
        // It may have exited before it was registered: its SIGCHLD is already gone.
        self.reap();
        rx
    }

    fn reap(&self) {
        let mut watched = self.watched.lock().unwrap();
        let done: Vec<(i32, ExitStatus)> = watched
            .keys()
            .filter_map(|&pid| {
                let status = match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(_, code)) => ExitStatus::from_raw((code & 0xff) << 8),
                    Ok(WaitStatus::Signaled(_, sig, _)) => ExitStatus::from_raw(sig as i32),
                    Ok(_) => return None, // still running (or stopped)
                    // Not our child yet: the launcher's intermediate process has not exited,
                    // so the task is not re-parented to us yet. Its exit (or, if it is already
                    // a zombie, its re-parenting) will send us SIGCHLD.
                    Err(Errno::ECHILD) if alive(pid) => return None,
                    // Not (or no longer) our child and gone: nothing will ever report it;
                    // count it as a failure rather than wait forever.
                    Err(Errno::ECHILD) => ExitStatus::from_raw(127 << 8),
                    Err(_) => return None,
                };
                Some((pid, status))
            })
            .collect();
        for (pid, status) in done {
            if let Some(tx) = watched.remove(&pid) {
                let _ = tx.send(status);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_task_watched_before_it_is_re_parented_to_us_is_still_waited_for() {
        let reaper = Reaper::install().unwrap();
        // A shell that starts a grandchild, tells its pid, and exits a little later: the
        // grandchild is someone else's child when it is watched, and ours afterwards.
        let mut shell = tokio::process::Command::new("sh")
            .args(["-c", "sleep 1 & echo $!; sleep 0.3"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = String::new();
        tokio::io::AsyncBufReadExt::read_line(
            &mut tokio::io::BufReader::new(shell.stdout.take().unwrap()),
            &mut out,
        )
        .await
        .unwrap();
        let grandchild: i32 = out.trim().parse().unwrap();
        let exit = reaper.watch(grandchild);
        assert!(shell.wait().await.unwrap().success());
        let status = tokio::time::timeout(Duration::from_secs(10), exit)
            .await
            .expect("the grandchild's exit is reported")
            .unwrap();
        assert!(status.success(), "{status:?}");
    }

    #[tokio::test]
    async fn a_pid_that_is_gone_counts_as_failed() {
        let reaper = Reaper::install().unwrap();
        let mut child = tokio::process::Command::new("true").spawn().unwrap();
        let pid = child.id().unwrap() as i32;
        child.wait().await.unwrap(); // reaped by tokio: nothing left to wait for
        let status = reaper.watch(pid).await.unwrap();
        assert_eq!(status.code(), Some(127));
    }
}
