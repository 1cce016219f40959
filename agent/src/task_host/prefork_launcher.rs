//! The task host's side of the pre-forked Python launcher (`agent/python/astro_launcher.py`).
//!
//! A fresh interpreter per task spends seconds importing Airflow before the task starts. The
//! launcher pays that once; each task is then a fork. The agent keeps the truth about tasks:
//! the launcher only reports a task's pid, the agent waits for the task itself (see
//! [`super::reaper`]). A launcher that dies or stops answering is killed and restarted with
//! backoff, and until it is ready again tasks start in fresh interpreters.
//!
//! The launcher forks processes ahead of time (spares) that wait for a job, so that a task
//! starts without a fork. Spares are re-parented to the agent like tasks; the launcher
//! announces each one, and the agent waits for it from then on, so a spare that exits unused
//! (its launcher died) does not stay a zombie.

use super::launcher_protocol::{LaunchRequest, LauncherMessage};
use super::launcher_script;
use super::reaper::Reaper;
use crate::frames::{self, Reader, Writer};
use airflow::backoff::Backoff;
use futures_util::FutureExt;
use nix::sys::signal::Signal;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use std::ffi::OsString;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::Interest;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{oneshot, watch, Mutex};
use tokio_util::sync::CancellationToken;

/// Importing Airflow can take tens of seconds on a busy node.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// A fork takes milliseconds; a launcher this slow to answer is hung.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a task that arrives while the first launcher is still starting waits for it. The
/// launcher has a head start on a fresh interpreter, which would import Airflow all over again
/// and take CPU from it; one that takes longer than this is not coming soon.
const FIRST_START_WAIT: Duration = Duration::from_secs(30);
/// A launcher that lived this long is considered healthy again (its restart backoff resets).
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// Spares beyond this many would start at once only on a very wide worker, and each holds a
/// process (its pages mostly shared with the launcher).
const MAX_SPARES: usize = 8;
/// How long the announcements a dead launcher left in its pipe are read for.
const LAST_WORDS_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the spares' announcements are read while no task starts.
const ANNOUNCEMENTS_READ_EVERY: Duration = Duration::from_secs(1);
/// How long a launcher whose stdin was closed gets to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

pub struct PreforkLauncher {
    python: PathBuf,
    env: Vec<(OsString, OsString)>,
    reaper: &'static Reaper,
    /// How many spares the launcher keeps: as many as tasks may start at once (the slots).
    spares: usize,
    /// The launcher that takes requests; `None` while there is none.
    ready: Mutex<Option<Launcher>>,
    /// Set once the first launcher is ready or has failed to start.
    first_start_over: watch::Sender<bool>,
}

/// A running launcher that has said it is ready.
struct Launcher {
    pid: i32,
    /// Closing it (a shutdown of our sending side) ends the launcher.
    requests: Writer<OwnedWriteHalf>,
    replies: Reader<OwnedReadHalf>,
}

/// Why the launcher did not start a task (it then starts in a fresh interpreter).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("the launcher is not ready")]
    NotReady,
    /// The launcher's own answer; it keeps running.
    #[error("the launcher could not start the task: {0}")]
    Refused(String),
    #[error("the launcher's pipe broke: {0}")]
    PipeBroke(std::io::Error),
    #[error("the launcher did not answer within {LAUNCH_TIMEOUT:?}")]
    Timeout,
    #[error("the launcher answered out of protocol: {0:?}")]
    OutOfProtocol(LauncherMessage),
}

impl PreforkLauncher {
    pub fn new(
        python: &Path,
        env: Vec<(OsString, OsString)>,
        reaper: &'static Reaper,
        slots: u32,
    ) -> Arc<Self> {
        Arc::new(PreforkLauncher {
            python: python.to_path_buf(),
            env,
            reaper,
            spares: (slots as usize).clamp(1, MAX_SPARES),
            ready: Mutex::new(None),
            first_start_over: watch::channel(false).0,
        })
    }

    /// Keeps a launcher running until `stop`: start, wait for ready, watch, restart.
    pub async fn supervise(self: Arc<Self>, stop: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            let started = Instant::now();
            let outcome = self.start().await;
            self.first_start_over.send_replace(true);
            match outcome {
                Ok((pid, mut exit)) => {
                    tracing::info!(pid, took = ?started.elapsed(), "task launcher ready");
                    let mut idle_reads = tokio::time::interval(ANNOUNCEMENTS_READ_EVERY);
                    loop {
                        tokio::select! {
                            status = &mut exit => {
                                tracing::warn!(?status, "task launcher exited; tasks start in fresh interpreters until it is back");
                                break;
                            }
                            _ = idle_reads.tick() => self.read_announcements().await,
                            _ = stop.cancelled() => {
                                // Closing our end ends it (its stdin reads end of file); running
                                // tasks are not its children.
                                drop(self.ready.lock().await.take());
                                if tokio::time::timeout(STOP_GRACE, exit).await.is_err() {
                                    self.reaper.signal(pid, Signal::SIGKILL);
                                }
                                return;
                            }
                        }
                    }
                    self.read_last_words().await;
                    if started.elapsed() > HEALTHY_AFTER {
                        backoff.reset();
                    }
                }
                Err(e) => {
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

    /// Starts a launcher and waits until it is ready; its pid, and its exit status on the
    /// receiver.
    async fn start(&self) -> std::io::Result<(i32, oneshot::Receiver<ExitStatus>)> {
        // Its stdin and stdout are one end of a socket pair, not pipes: a task (same user) that
        // catches a new launcher before it is not dumpable could open a pipe again through
        // `/proc/<pid>/fd` and read the requests, workloads and tokens included; a socket
        // cannot be opened that way.
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let (child, exit) = self.reaper.spawn(
            launcher_script::command(&self.python, self.spares.to_string())
                .env_clear()
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::from(OwnedFd::from(theirs.try_clone()?)))
                .stdout(Stdio::from(OwnedFd::from(theirs)))
                .stderr(Stdio::inherit())
                // Its own group: a Ctrl-C in the agent's terminal is the agent's to handle.
                .process_group(0),
        )?;
        let pid = child.id() as i32;
        ours.set_nonblocking(true)?;
        let (replies, requests) = UnixStream::from_std(ours)?.into_split();
        let mut launcher = Launcher {
            pid,
            requests: frames::writer(requests),
            replies: frames::reader(replies),
        };
        match tokio::time::timeout(READY_TIMEOUT, frames::receive(&mut launcher.replies)).await {
            Ok(Ok(LauncherMessage::Ready)) => {}
            other => {
                self.reaper.signal(pid, Signal::SIGKILL);
                return Err(std::io::Error::other(format!(
                    "no ready message: {other:?}"
                )));
            }
        }
        *self.ready.lock().await = Some(launcher);
        Ok((pid, exit))
    }

    /// After the launcher has exited: the spares it announced but nobody read about yet.
    async fn read_last_words(&self) {
        if let Some(mut launcher) = self.ready.lock().await.take() {
            let _ =
                tokio::time::timeout(LAST_WORDS_TIMEOUT, self.reply(&mut launcher.replies)).await;
        }
    }

    /// The spares' announcements that wait in the pipe while no task is being launched: every
    /// spare is watched within [`ANNOUNCEMENTS_READ_EVERY`], not only at the next launch (an
    /// unwatched child is a task's leftover to the task host, see `leftovers`).
    async fn read_announcements(&self) {
        let Ok(mut ready) = self.ready.try_lock() else {
            return; // a launch is reading them
        };
        let Some(launcher) = ready.as_mut() else {
            return;
        };
        // Polled once each: a frame not complete yet stays in the reader's buffer.
        while let Some(message) = frames::receive(&mut launcher.replies).now_or_never() {
            match message {
                Ok(LauncherMessage::Spare { pid }) if pid > 0 => drop(self.reaper.watch(pid)),
                Ok(other) => tracing::warn!(?other, "the launcher said something out of turn"),
                Err(_) => return, // its end: `supervise` sees the exit
            }
        }
    }

    /// The next message that is not a spare's announcement; announced spares are waited for.
    async fn reply(&self, replies: &mut Reader<OwnedReadHalf>) -> std::io::Result<LauncherMessage> {
        loop {
            match frames::receive(replies).await? {
                // Nobody needs its exit status unless it runs a task, which then watches it
                // again; until then this only reaps it.
                LauncherMessage::Spare { pid } if pid > 0 => drop(self.reaper.watch(pid)),
                message => return Ok(message),
            }
        }
    }

    /// Waits until the first launcher is ready or has failed to start.
    async fn wait_first_start(&self) {
        let mut rx = self.first_start_over.subscribe();
        let _ = rx.wait_for(|over| *over).await;
    }

    /// Asks the launcher to start a task, linked to the task host by `output`; its pid, or why
    /// not. Any failure other than the launcher's own "could not fork" answer leaves the
    /// launcher killed, to be restarted.
    pub async fn launch(
        &self,
        request: &LaunchRequest<'_>,
        output: OwnedFd,
    ) -> Result<i32, LaunchError> {
        if !*self.first_start_over.borrow()
            && tokio::time::timeout(FIRST_START_WAIT, self.wait_first_start())
                .await
                .is_err()
        {
            tracing::warn!("task launcher not ready after {FIRST_START_WAIT:?}");
        }
        let mut ready = self.ready.lock().await;
        let launcher = ready.as_mut().ok_or(LaunchError::NotReady)?;
        let exchange = async {
            send_descriptor(launcher.requests.get_ref().as_ref(), output).await?;
            frames::send(&mut launcher.requests, request).await?;
            self.reply(&mut launcher.replies).await
        };
        let failure = match tokio::time::timeout(LAUNCH_TIMEOUT, exchange).await {
            Ok(Ok(LauncherMessage::Started { id, pid })) if id == request.id && pid > 0 => {
                return Ok(pid)
            }
            Ok(Ok(LauncherMessage::Failed { error, .. })) => {
                return Err(LaunchError::Refused(error))
            }
            Ok(Ok(other)) => LaunchError::OutOfProtocol(other),
            Ok(Err(e)) => LaunchError::PipeBroke(e),
            Err(_) => LaunchError::Timeout,
        };
        if let Some(launcher) = ready.take() {
            self.reaper.signal(launcher.pid, Signal::SIGKILL);
        }
        Err(failure)
    }
}

/// Sends `fd` to the launcher with one byte (`SCM_RIGHTS`), between two frames; our copy is
/// closed once it is on its way.
async fn send_descriptor(stream: &UnixStream, fd: OwnedFd) -> std::io::Result<()> {
    loop {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            sendmsg::<()>(
                stream.as_raw_fd(),
                &[IoSlice::new(b"f")],
                &[ControlMessage::ScmRights(&[fd.as_raw_fd()])],
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(std::io::Error::from)
        });
        match sent {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::LaunchMode;
    use crate::task_host::task_process::tests::gone;
    use crate::task_host::task_process::{Exit, TaskProcess};
    use crate::task_host::task_spawner::tests::settings;
    use crate::task_host::task_spawner::TaskSpawner;
    use nix::unistd::Pid;
    use std::process::Command;

    /// What `check` prints, run by python3 with the launcher script importable.
    fn run_script(check: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("astro_launcher.py"),
            launcher_script::SOURCE,
        )
        .unwrap();
        let (mut child, _exit) = Reaper::global()
            .spawn(
                Command::new("python3")
                    .args(["-c", check])
                    .env("PYTHONPATH", dir.path())
                    .current_dir(dir.path())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null()),
            )
            .unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        out.trim().to_owned()
    }

    #[test]
    fn a_fork_that_fails_before_the_task_takes_over_exits_non_zero() {
        // A subreaper, so that the grandchild is re-parented to it and can be waited for.
        let exit = run_script(
            "import ctypes, os, sys\n\
            ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n\
            import astro_launcher\n\
            pid = astro_launcher._double_fork(lambda: 1 / 0)\n\
            print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))",
        );
        assert_eq!(exit, "1");
    }

    #[test]
    fn a_task_runs_only_once_the_task_host_has_answered_its_claim() {
        // The task claims with its pid and waits; a link closed unanswered ends it unrun (exit
        // 0, before the supervisor's import, which fails here: exit 1 once past the claim).
        let run = |answer: &str| {
            run_script(&format!(
                "import os, socket, struct, astro_launcher\n\
                host, task = socket.socketpair()\n\
                pid = os.fork()\n\
                if pid == 0:\n\
                \x20   host.close()\n\
                \x20   astro_launcher._run_task({{'workload': {{}}}}, task.detach())\n\
                task.close()\n\
                claimed = struct.unpack('>i', host.recv(4))[0]\n\
                {answer}\n\
                print(claimed == pid, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))"
            ))
        };
        assert_eq!(run("host.close()"), "True 0", "closed unanswered: not run");
        assert_eq!(run("host.sendall(b'!')"), "True 1", "let go: run");
    }

    // ---- tasks through the real launcher script, with a fake `airflow` package ----

    const FAKE_EXECUTE_WORKLOAD: &str = r#"
import argparse, importlib, json, os, sys, time
def hostname():
    # What Airflow's get_hostname does: import the configured callable and call it.
    module, name = os.environ["AIRFLOW__CORE__HOSTNAME_CALLABLE"].rsplit(".", 1)
    return getattr(importlib.import_module(module), name)()
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json-path")
    parser.add_argument("--json-string")
    args = parser.parse_args()
    w = json.load(open(args.json_path)) if args.json_path else json.loads(args.json_string)
    record = {"pid": os.getpid(), "pgid": os.getpgid(0),
              "launcher": "astro_launcher" in sys.modules, "path": sys.path,
              "secret": os.environ.get("AIRFLOW__API_AUTH__JWT_SECRET"),
              "hostname": hostname()}
    # The task process, forked by the supervisor: it names its host too, then starts user code,
    # whose own subprocesses see the callable it leaves in the environment.
    task = os.fork()
    if task == 0:
        with open(w["record"] + ".task", "w") as f:
            json.dump({"hostname": hostname(),
                       "callable_for_children": os.environ.get("AIRFLOW__CORE__HOSTNAME_CALLABLE")}, f)
        os._exit(0)
    os.waitpid(task, 0)
    record["task"] = json.load(open(w["record"] + ".task"))
    record["edge_module_loaded"] = "airflow.providers.edge3.cli.worker" in sys.modules
    if w.get("leave_child"):
        # What `sleep 1 &` in a BashOperator leaves: a child nobody waits for.
        import subprocess
        record["left"] = subprocess.Popen(["sleep", str(w["leave_child"])]).pid
    with open(w["record"], "w") as f:
        json.dump(record, f)
    print("fake supervisor running", flush=True)
    if w.get("supervisor_end"):
        # What Airflow's supervisor does at a task's end: the task closes its sockets, then
        # exits; the supervisor selects on a selector with nothing registered until it exits.
        import selectors
        sel = selectors.DefaultSelector()
        child = os.fork()
        if child == 0:
            restored = selectors.DefaultSelector.select.__module__ == "selectors"
            time.sleep(0.2)
            os._exit(0 if restored else 7)
        started = time.monotonic()
        sel.select(timeout=30)
        record["select_returned_after"] = time.monotonic() - started
        _, status = os.waitpid(child, 0)
        record["child_exit"] = os.waitstatus_to_exitcode(status)
        with open(w["record"], "w") as f:
            json.dump(record, f)
    while w.get("hold_until") and not os.path.exists(w["hold_until"]):
        time.sleep(0.01)
    time.sleep(w.get("sleep", 0))
    sys.exit(w.get("exit", 0))
if __name__ == "__main__":
    main()
"#;

    /// A PYTHONPATH folder with just enough of `airflow` (and `pydantic`) for the launcher's
    /// imports and for `-m airflow.sdk.execution_time.execute_workload`.
    fn fake_airflow(dir: &Path, with_sdk_log: bool) -> PathBuf {
        let root = dir.join("pythonpath");
        let mut files = vec![
            ("pydantic.py", ""),
            ("airflow/__init__.py", ""),
            ("airflow/executors/__init__.py", ""),
            ("airflow/executors/workloads.py", ""),
            (
                "airflow/executors/base_executor.py",
                "class BaseExecutor: pass\n",
            ),
            ("airflow/sdk/__init__.py", ""),
            ("airflow/sdk/execution_time/__init__.py", ""),
            ("airflow/sdk/execution_time/supervisor.py", ""),
            ("airflow/providers/__init__.py", ""),
            ("airflow/providers/edge3/__init__.py", ""),
            ("airflow/providers/edge3/cli/__init__.py", ""),
            (
                "airflow/providers/edge3/cli/worker.py",
                "import os\ndef _edge_hostname():\n    return os.environ.get(\"HOSTNAME\", \"fqdn\")\n",
            ),
            (
                "airflow/sdk/execution_time/execute_workload.py",
                FAKE_EXECUTE_WORKLOAD,
            ),
        ];
        if with_sdk_log {
            files.push(("airflow/sdk/log.py", "def configure_logging(**kw): pass\n"));
        }
        for (path, content) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        root
    }

    pub(crate) struct Prefork {
        pub(crate) spawner: TaskSpawner,
        stop: CancellationToken,
        dir: tempfile::TempDir,
    }

    impl Drop for Prefork {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    fn prefork(with_sdk_log: bool) -> Prefork {
        prefork_in(LaunchMode::Prefork, with_sdk_log)
    }

    /// The real launcher script (or fresh interpreters) with the fake `airflow` package.
    pub(crate) fn prefork_in(mode: LaunchMode, with_sdk_log: bool) -> Prefork {
        let dir = tempfile::tempdir().unwrap();
        let pythonpath = fake_airflow(dir.path(), with_sdk_log);
        let python = PathBuf::from("python3");
        let parent = vec![
            ("PATH".into(), std::env::var_os("PATH").unwrap()),
            ("PYTHONPATH".into(), pythonpath.into_os_string()),
            (
                "AIRFLOW__API_AUTH__JWT_SECRET".into(),
                "airflow-secret".into(),
            ),
        ];
        let spawner = TaskSpawner::new(
            settings(&python, mode),
            crate::task_env::inherited(parent.into_iter(), &[]).into_iter(),
        );
        let stop = CancellationToken::new();
        if let Some(launcher) = spawner.prefork_launcher() {
            tokio::spawn(launcher.supervise(stop.clone()));
        }
        Prefork { spawner, stop, dir }
    }

    impl Prefork {
        pub(crate) fn workload(&self, name: &str, sleep: f64, exit: i32) -> serde_json::Value {
            let record = self.dir.path().join(format!("{name}.record"));
            serde_json::json!({"record": record, "sleep": sleep, "exit": exit})
        }

        pub(crate) fn record(&self, name: &str) -> serde_json::Value {
            let text =
                std::fs::read_to_string(self.dir.path().join(format!("{name}.record"))).unwrap();
            serde_json::from_str(&text).unwrap()
        }

        async fn run(&self, name: &str, sleep: f64, exit: i32) -> (TaskProcess, ExitStatus) {
            let mut p = self
                .spawner
                .spawn(&self.workload(name, sleep, exit))
                .await
                .unwrap();
            let status = match p.wait(&CancellationToken::new()).await.unwrap() {
                Exit::Finished(s) => s,
                other => panic!("{other:?}"),
            };
            (p, status)
        }
    }

    /// A task's Python searches PYTHONPATH first: not the current folder (where a task may drop
    /// a module), nor a folder the launcher's source was written to.
    fn first_on_the_path_is_pythonpath(pf: &Prefork, rec: &serde_json::Value) {
        let pythonpath = pf.dir.path().join("pythonpath");
        assert_eq!(rec["path"][0], pythonpath.to_str().unwrap(), "{rec}");
    }

    /// Waits until a launcher takes requests; its pid.
    pub(crate) async fn ready(launcher: &PreforkLauncher) -> i32 {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Some(ready) = launcher.ready.lock().await.as_ref() {
                    return ready.pid;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("launcher ready")
    }

    #[tokio::test]
    async fn prefork_forks_tasks_from_the_launcher_and_learns_their_exit() {
        let pf = prefork(true);
        let launcher = pf.spawner.prefork_launcher().unwrap();
        ready(&launcher).await;
        // The task holds until released, so its parent can be read while it runs: a task forked
        // without a spare starts before its intermediate process has exited.
        let release = pf.dir.path().join("release");
        let mut workload = pf.workload("ok", 0.0, 0);
        workload["hold_until"] = release.to_str().unwrap().into();
        let mut p = pf.spawner.spawn(&workload).await.unwrap();
        let agent = std::process::id() as i32;
        let mut parent = None;
        for _ in 0..500 {
            parent = parent_of(p.pid());
            if parent == Some(agent) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(parent, Some(agent), "re-parented to the agent");
        std::fs::write(&release, "").unwrap();
        let status = match p.wait(&CancellationToken::new()).await.unwrap() {
            Exit::Finished(s) => s,
            other => panic!("{other:?}"),
        };
        assert!(status.success());
        let rec = pf.record("ok");
        assert_eq!(rec["launcher"], true, "forked from the launcher: {rec}");
        first_on_the_path_is_pythonpath(&pf, &rec);
        assert_eq!(rec["pid"], rec["pgid"], "its own process group");
        assert_eq!(rec["pid"].as_i64(), Some(p.pid() as i64));
        assert_eq!(
            rec["secret"],
            serde_json::Value::Null,
            "no JWT secret in the launcher's env"
        );
        assert!(p.output_tail(1024).contains("fake supervisor running"));
        // The worker's name as the host, without the edge provider's module; the task's own
        // subprocesses get the callable the user configured (none here: Airflow's default).
        assert_eq!(rec["hostname"], "worker-7", "{rec}");
        assert_eq!(rec["edge_module_loaded"], false, "{rec}");
        assert_eq!(rec["task"]["hostname"], "worker-7", "{rec}");
        assert_eq!(
            rec["task"]["callable_for_children"],
            serde_json::Value::Null,
            "{rec}"
        );
        let (_, status) = pf.run("fails", 0.0, 3).await;
        assert_eq!(status.code(), Some(3));
    }

    #[tokio::test]
    async fn the_supervisor_wakes_up_when_its_task_process_exits() {
        let pf = prefork(true);
        ready(&pf.spawner.prefork_launcher().unwrap()).await;
        let mut workload = pf.workload("end", 0.0, 0);
        workload["supervisor_end"] = true.into();
        let mut p = pf.spawner.spawn(&workload).await.unwrap();
        let exit = p.wait(&CancellationToken::new()).await.unwrap();
        assert!(matches!(exit, Exit::Finished(s) if s.success()), "{exit:?}");
        let rec = pf.record("end");
        // Woken by the child's exit, not by the 30 s timeout of an empty selector.
        let waited = rec["select_returned_after"].as_f64().unwrap();
        assert!(waited < 20.0, "select waited {waited} s: {rec}");
        assert_eq!(
            rec["child_exit"], 0,
            "the task (forked by the supervisor) has the original select: {rec}"
        );
    }

    #[tokio::test]
    async fn a_launcher_killed_mid_run_loses_no_task_and_comes_back() {
        let pf = prefork(true);
        let launcher = pf.spawner.prefork_launcher().unwrap();
        let first_pid = ready(&launcher).await;
        let mut running = pf
            .spawner
            .spawn(&pf.workload("long", 1.0, 0))
            .await
            .unwrap();
        nix::sys::signal::kill(Pid::from_raw(first_pid), Signal::SIGKILL).unwrap();
        // The task outlives its launcher and the agent still learns how it ended.
        let exit = running.wait(&CancellationToken::new()).await.unwrap();
        assert!(matches!(exit, Exit::Finished(s) if s.success()), "{exit:?}");
        // Meanwhile or afterwards, tasks still start (fresh or from the new launcher).
        let (_, status) = pf.run("next", 0.0, 0).await;
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(30), async {
            while ready(&launcher).await == first_pid {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("a new launcher is started");
        let (_, status) = pf.run("after", 0.0, 0).await;
        assert!(status.success());
        assert_eq!(pf.record("after")["launcher"], true);
    }

    /// The parent of a live process, from `/proc/<pid>/stat` (field 4, after the name).
    fn parent_of(pid: i32) -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, after_name) = stat.rsplit_once(") ")?;
        after_name.split(' ').nth(1)?.parse().ok()
    }

    /// The processes a launcher forked that are still in its process group (a task leaves the
    /// group), with their parents: spares, and intermediates on their way out.
    fn forked_by(launcher: i32) -> Vec<(i32, i32)> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let after_name = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
            let fields: Vec<&str> = after_name.split(' ').collect();
            let field = |i: usize| fields.get(i).and_then(|f| f.parse::<i32>().ok());
            if field(2) == Some(launcher) && pid != launcher {
                found.push((pid, field(1).unwrap_or(0)));
            }
        }
        found
    }

    #[tokio::test]
    async fn spares_wait_as_children_of_the_agent_and_are_reaped_when_their_launcher_dies() {
        let pf = prefork(true);
        let launcher = pf.spawner.prefork_launcher().unwrap();
        let launcher_pid = ready(&launcher).await;
        let agent = std::process::id() as i32;
        // No spare before demand. Absence has no event to wait for: give the launcher its quiet
        // second (and some) in which it used to make spares unasked.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            forked_by(launcher_pid),
            vec![],
            "no spare on a worker that ran nothing"
        );
        // Two tasks started at once want two spares (settings(): 2 slots), each re-parented to
        // the agent once the intermediate process that forked it has exited.
        let (first, second) = tokio::join!(pf.run("a", 0.0, 0), pf.run("b", 0.0, 0));
        assert!(first.1.success() && second.1.success());
        let mut forked = Vec::new();
        for _ in 0..500 {
            forked = forked_by(launcher_pid);
            if forked.len() == 2 && forked.iter().all(|&(_, parent)| parent == agent) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            forked.len() == 2 && forked.iter().all(|&(_, parent)| parent == agent),
            "two spares, children of the agent ({agent}): {forked:?}"
        );
        // Watched while the worker is idle, not only from the next launch on: an unwatched
        // child would be a task's leftover.
        let watched = |reaper: &Reaper| {
            let unwatched = reaper.unwatched_children();
            forked
                .iter()
                .all(|&(pid, _)| !unwatched.iter().any(|p| p.pid == pid))
        };
        let mut announced = false;
        for _ in 0..500 {
            if watched(Reaper::global()) {
                announced = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(announced, "the spares are not watched: {forked:?}");
        nix::sys::signal::kill(Pid::from_raw(launcher_pid), Signal::SIGKILL).unwrap();
        for (pid, _) in forked {
            // Gone from /proc altogether: exited and waited for, not left a zombie.
            let mut reaped = false;
            for _ in 0..500 {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    reaped = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(reaped, "spare {pid} is still there");
        }
    }

    #[tokio::test]
    async fn a_launcher_that_cannot_start_falls_back_to_fresh_interpreters() {
        let pf = prefork(false); // the launcher's imports fail; execute_workload itself works
        let (p, status) = pf.run("fallback", 0.0, 0).await;
        assert!(status.success());
        assert_eq!(p.launched_by(), LaunchMode::Fresh);
        // A fresh interpreter runs the launcher script for its one task.
        let rec = pf.record("fallback");
        assert_eq!(rec["launcher"], true, "{rec}");
        first_on_the_path_is_pythonpath(&pf, &rec);
    }

    #[tokio::test]
    async fn prefork_tasks_are_stopped_by_process_group() {
        let pf = prefork(true);
        ready(&pf.spawner.prefork_launcher().unwrap()).await;
        let mut p = pf
            .spawner
            .spawn(&pf.workload("stuck", 300.0, 0))
            .await
            .unwrap();
        let kill = CancellationToken::new();
        kill.cancel();
        let exit = tokio::time::timeout(Duration::from_secs(15), p.wait(&kill))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(exit, Exit::Killed(_)), "{exit:?}");
        assert!(gone(p.pid()).await);
    }
}
