//! The agent's side of the pre-forked Python launcher (`agent/python/astro_launcher.py`).
//!
//! A fresh interpreter per task spends seconds importing Airflow before the task starts. The
//! launcher pays that once; each task is then a fork. The agent keeps the truth about tasks:
//! the launcher only reports a task's pid, the agent waits for the task itself (see
//! [`crate::reaper`]). A launcher that dies or stops answering is killed and restarted with
//! backoff, and until it is ready again tasks start in fresh interpreters.
//!
//! The launcher forks processes ahead of time (spares) that wait for a job, so that a task
//! starts without a fork. Spares are re-parented to the agent like tasks; the launcher
//! announces each one, and the agent waits for it from then on, so a spare that exits unused
//! (its launcher died) does not stay a zombie.

use crate::launcher_frame::{read_message, write_message};
use crate::reaper::Reaper;
use airflow::backoff::Backoff;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{oneshot, watch, Mutex};
use tokio_util::sync::CancellationToken;

/// The launcher's source, written next to the workload files at start-up, so the agent binary
/// is all there is to install.
const SCRIPT: &str = include_str!("../python/astro_launcher.py");
/// Importing Airflow can take tens of seconds on a busy node.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// A fork takes milliseconds; a launcher this slow to answer is hung.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(10);
/// A launcher that lived this long is considered healthy again (its restart backoff resets).
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// Spares beyond this many would start at once only on a very wide worker, and each holds a
/// process (its pages mostly shared with the launcher).
const MAX_SPARES: usize = 8;
/// How long the announcements a dead launcher left in its pipe are read for.
const LAST_WORDS_TIMEOUT: Duration = Duration::from_secs(2);

/// What to start a task with, as the launcher needs it.
pub struct LaunchRequest<'a> {
    pub id: &'a str,
    pub workload: &'a Path,
    pub output: &'a Path,
    pub claim: &'a Path,
}

pub struct PreforkLauncher {
    python: PathBuf,
    script: PathBuf,
    env: Vec<(OsString, OsString)>,
    reaper: &'static Reaper,
    /// How many spares the launcher keeps: as many as tasks may start at once (the slots).
    spares: usize,
    /// The pipes of the launcher that is ready; `None` while there is none.
    channel: Mutex<Option<(ChildStdin, ChildStdout)>>,
    pid: AtomicI32,
    state: watch::Sender<State>,
}

/// Whether a launcher can take requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not tried yet.
    Starting,
    Ready,
    Down,
}

impl PreforkLauncher {
    pub fn new(
        python: &Path,
        work_dir: &Path,
        env: Vec<(OsString, OsString)>,
        reaper: &'static Reaper,
        slots: u32,
    ) -> std::io::Result<Arc<Self>> {
        let script = work_dir.join("astro_launcher.py");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&script)?
            .write_all(SCRIPT.as_bytes())?;
        Ok(Arc::new(PreforkLauncher {
            python: python.to_path_buf(),
            script,
            env,
            reaper,
            spares: (slots as usize).clamp(1, MAX_SPARES),
            channel: Mutex::new(None),
            pid: AtomicI32::new(0),
            state: watch::channel(State::Starting).0,
        }))
    }

    /// Keeps a launcher running until `stop`: start, wait for ready, watch, restart.
    pub async fn supervise(self: Arc<Self>, stop: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            let started = Instant::now();
            match self.start().await {
                Ok(mut exit) => {
                    tracing::info!(pid = self.pid.load(Ordering::Acquire), took = ?started.elapsed(), "task launcher ready");
                    tokio::select! {
                        status = &mut exit => {
                            tracing::warn!(?status, "task launcher exited; tasks start in fresh interpreters until it is back");
                        }
                        _ = stop.cancelled() => {
                            // Closing its stdin ends it; running tasks are not its children.
                            self.take_channel().await;
                            if tokio::time::timeout(Duration::from_secs(5), exit).await.is_err() {
                                self.kill();
                            }
                            return;
                        }
                    }
                    self.read_last_words().await;
                    if started.elapsed() > HEALTHY_AFTER {
                        backoff.reset();
                    }
                }
                Err(e) => {
                    self.state.send_replace(State::Down);
                    tracing::warn!(error = %e, "task launcher did not start; tasks start in fresh interpreters");
                }
            }
            let delay = backoff.next_delay();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Starts a launcher and waits until it is ready; its exit status arrives on the receiver.
    async fn start(&self) -> std::io::Result<oneshot::Receiver<ExitStatus>> {
        let (mut child, exit) = self.reaper.spawn(
            Command::new(&self.python)
                .arg(&self.script)
                .arg(self.spares.to_string())
                .env_clear()
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                // Its own group: a Ctrl-C in the agent's terminal is the agent's to handle.
                .process_group(0),
        )?;
        let pid = child.id() as i32;
        let mut stdin = ChildStdin::from_std(child.stdin.take().expect("piped"))?;
        let mut stdout = ChildStdout::from_std(child.stdout.take().expect("piped"))?;
        let ready = tokio::time::timeout(READY_TIMEOUT, read_message(&mut stdout)).await;
        match ready {
            Ok(Ok(message)) if message["ready"] == json!(true) => {}
            other => {
                self.reaper.signal(pid, Signal::SIGKILL);
                let _ = stdin.shutdown().await;
                return Err(std::io::Error::other(format!(
                    "no ready message: {other:?}"
                )));
            }
        }
        self.pid.store(pid, Ordering::Release);
        *self.channel.lock().await = Some((stdin, stdout));
        self.state.send_replace(State::Ready);
        Ok(exit)
    }

    async fn take_channel(&self) -> Option<(ChildStdin, ChildStdout)> {
        let channel = self.channel.lock().await.take();
        self.state.send_replace(State::Down);
        channel
    }

    /// After the launcher has exited: the spares it announced but nobody read about yet.
    async fn read_last_words(&self) {
        if let Some((_, mut stdout)) = self.take_channel().await {
            let _ = tokio::time::timeout(LAST_WORDS_TIMEOUT, self.read_reply(&mut stdout)).await;
        }
    }

    /// The next message that is not a spare's announcement; announced spares are waited for.
    async fn read_reply(&self, stdout: &mut ChildStdout) -> std::io::Result<Value> {
        loop {
            let message = read_message(stdout).await?;
            match message["spare"].as_i64() {
                // Nobody needs its exit status unless it runs a task, which then watches it
                // again; until then this only reaps it.
                Some(pid) if pid > 0 => drop(self.reaper.watch(pid as i32)),
                _ => return Ok(message),
            }
        }
    }

    /// The launcher's pid while one runs (0 before the first start).
    #[cfg(test)]
    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::Acquire)
    }

    /// Waits until a launcher is ready to take requests.
    #[cfg(test)]
    pub async fn wait_ready(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| *s == State::Ready).await;
    }

    /// Waits until the first launcher is ready or has failed to start.
    pub async fn wait_first_start(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| *s != State::Starting).await;
    }

    /// Asks the launcher to start a task; its pid, or why not. Any failure other than the
    /// launcher's own "could not fork" answer leaves the launcher killed, to be restarted.
    pub async fn launch(&self, request: &LaunchRequest<'_>) -> Result<i32, String> {
        let mut guard = self.channel.lock().await;
        let Some((stdin, stdout)) = guard.as_mut() else {
            return Err("the launcher is not ready".into());
        };
        let message = json!({
            "id": request.id,
            "workload": request.workload,
            "output": request.output,
            "claim": request.claim,
        });
        let exchange = async {
            write_message(stdin, &message).await?;
            self.read_reply(stdout).await
        };
        let answer = match tokio::time::timeout(LAUNCH_TIMEOUT, exchange).await {
            Ok(Ok(answer)) => answer,
            failed => {
                guard.take();
                self.state.send_replace(State::Down);
                self.kill();
                return Err(match failed {
                    Ok(Err(e)) => format!("the launcher's pipe broke: {e}"),
                    _ => format!("the launcher did not answer within {LAUNCH_TIMEOUT:?}"),
                });
            }
        };
        match (
            answer["id"].as_str(),
            answer["pid"].as_i64(),
            answer["error"].as_str(),
        ) {
            (Some(id), Some(pid), _) if id == request.id && pid > 0 => Ok(pid as i32),
            (_, _, Some(error)) => Err(format!("the launcher could not start the task: {error}")),
            _ => {
                guard.take();
                self.state.send_replace(State::Down);
                self.kill();
                Err(format!("the launcher answered out of protocol: {answer}"))
            }
        }
    }

    fn kill(&self) {
        self.reaper
            .signal(self.pid.load(Ordering::Acquire), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a process the launcher forks exits with when it fails before the task takes over.
    fn exit_of_a_failing_fork() -> i32 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("astro_launcher.py"), SCRIPT).unwrap();
        // A subreaper, so that the grandchild is re-parented to it and can be waited for.
        let check = "import ctypes, os, sys\n\
            ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n\
            import astro_launcher\n\
            pid = astro_launcher._double_fork(lambda: 1 / 0)\n\
            print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))";
        let (mut child, _exit) = Reaper::global()
            .spawn(
                Command::new("python3")
                    .args(["-c", check])
                    .env("PYTHONPATH", dir.path())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null()),
            )
            .unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        out.trim().parse().unwrap()
    }

    #[test]
    fn a_fork_that_fails_before_the_task_takes_over_exits_non_zero() {
        assert_eq!(exit_of_a_failing_fork(), 1);
    }
}
