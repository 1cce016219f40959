//! Waiting for every child process of the agent, in one place.
//!
//! Tasks started by the pre-forked launcher are its grandchildren. The agent makes itself a
//! *child subreaper*, so when the launcher's intermediate process exits the task is re-parented
//! to the agent, which can then wait for it like its own child — and still learns the task's
//! exit status if the launcher dies. Being a subreaper also makes the agent the parent of
//! anything a task leaves behind (`sleep 1 &` in a BashOperator, a supervisor's child after a
//! SIGKILL): nobody else will ever wait for those, so the agent waits for *every* child
//! (`waitpid(-1)`), not only the ones it knows about.
//!
//! That is only sound if nothing else in the process waits for children by pid (tokio's
//! `process` module, `std::process::Child::wait`): every child of the agent is started through
//! [`Reaper::spawn`], and its exit status comes from here. A status can arrive before anyone
//! asked for it (a task the launcher forked may exit before the launcher's answer is read), so
//! statuses of pids nobody watches are kept for a while.
//!
//! A thread blocked in `waitpid` does the waiting: no signal handler, and it serves every
//! runtime of the process (the tests run many).

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Condvar, Mutex, OnceLock};
use tokio::sync::oneshot;

/// Exit statuses kept for pids nobody has asked about yet. Most are strays a task left behind
/// that nobody will ever ask about; a task's own status is asked for within milliseconds.
const UNCLAIMED_KEPT: usize = 1024;

pub struct Reaper {
    state: Mutex<State>,
    /// Signalled when a child is started, which ends the thread's wait for "any children".
    spawned: Condvar,
    subreaper: bool,
}

#[derive(Default)]
struct State {
    watched: HashMap<i32, oneshot::Sender<ExitStatus>>,
    /// Reaped before anyone watched them, oldest first.
    unclaimed: VecDeque<(i32, ExitStatus)>,
    /// Children started so far; the thread sleeps while it is unchanged and no child is left.
    spawns: u64,
}

/// Whether a process with this pid exists (a zombie included).
fn alive(pid: i32) -> bool {
    !matches!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH))
}

impl Reaper {
    /// The process's reaper: on first use, becomes a child subreaper (if the kernel lets it)
    /// and starts the thread that waits for children.
    pub fn global() -> &'static Reaper {
        static REAPER: OnceLock<Reaper> = OnceLock::new();
        REAPER.get_or_init(|| {
            let subreaper = match nix::sys::prctl::set_child_subreaper(true) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot become a child subreaper: tasks start in fresh interpreters, and what they leave behind is not reaped here");
                    false
                }
            };
            std::thread::Builder::new()
                .name("reaper".into())
                .spawn(|| Reaper::global().run())
                .expect("starting the reaper thread");
            Reaper {
                state: Mutex::new(State::default()),
                spawned: Condvar::new(),
                subreaper,
            }
        })
    }

    /// Whether processes a child forks are re-parented to the agent when their parent exits.
    pub fn is_subreaper(&self) -> bool {
        self.subreaper
    }

    /// Starts `command`; its exit status arrives on the receiver. Never wait on the returned
    /// `Child` itself (only its pipes are for use).
    pub fn spawn(
        &self,
        command: &mut Command,
    ) -> std::io::Result<(Child, oneshot::Receiver<ExitStatus>)> {
        // Holding the lock across the fork: the thread may reap the child at once, but cannot
        // hand its status out before it is watched.
        let mut state = self.state.lock().unwrap();
        let child = command.spawn()?;
        state.spawns += 1;
        self.spawned.notify_one();
        let (tx, rx) = oneshot::channel();
        state.watched.insert(child.id() as i32, tx);
        Ok((child, rx))
    }

    /// The exit status of `pid`, which must be (or become) a child of this process.
    pub fn watch(&self, pid: i32) -> oneshot::Receiver<ExitStatus> {
        let (tx, rx) = oneshot::channel();
        let mut state = self.state.lock().unwrap();
        if let Some(i) = state.unclaimed.iter().position(|&(p, _)| p == pid) {
            let (_, status) = state.unclaimed.remove(i).expect("found");
            // A live process with this pid is a newer one (the pid was reused): only a status
            // reaped after it was watched is its own.
            if !alive(pid) {
                let _ = tx.send(status);
                return rx;
            }
        }
        if !alive(pid) {
            // Not reaped here and gone: reaped by someone else, nothing will ever report it;
            // count it as a failure rather than wait forever.
            let _ = tx.send(ExitStatus::from_raw(127 << 8));
            return rx;
        }
        state.watched.insert(pid, tx);
        rx
    }

    /// Signals `pid` if it is a watched process that has not been reaped yet: only then can
    /// the pid not have been reused by an unrelated process. False if nothing was signalled.
    pub fn signal(&self, pid: i32, signal: Signal) -> bool {
        self.signal_watched(pid, || kill(Pid::from_raw(pid), signal))
    }

    /// Signals the process group `pid` leads, under the same condition as [`Reaper::signal`].
    pub fn signal_group(&self, pid: i32, signal: Signal) -> bool {
        self.signal_watched(pid, || killpg(Pid::from_raw(pid), signal))
    }

    /// This process's children that nobody watches: left behind by the processes they were
    /// born to (see `leftovers`).
    pub fn unwatched_children(&self) -> HashSet<ProcessId> {
        let state = self.state.lock().unwrap();
        own_children()
            .into_iter()
            .filter(|child| !state.watched.contains_key(&child.pid))
            .collect()
    }

    /// Signals `process` if it is still an unwatched child of this process: the lock keeps the
    /// thread from reaping it, so its pid cannot have been given to another process.
    pub fn signal_unwatched_child(&self, process: ProcessId, signal: Signal) -> bool {
        let state = self.state.lock().unwrap();
        !state.watched.contains_key(&process.pid)
            && child_of_mine(process.pid) == Some(process)
            && kill(Pid::from_raw(process.pid), signal).is_ok()
    }

    fn signal_watched(&self, pid: i32, send: impl FnOnce() -> nix::Result<()>) -> bool {
        // The lock keeps the thread from reaping (and the kernel from reusing) the pid while
        // the signal goes out.
        let state = self.state.lock().unwrap();
        pid > 1 && state.watched.contains_key(&pid) && send().is_ok()
    }

    fn run(&self) {
        loop {
            let spawns = self.state.lock().unwrap().spawns;
            // Peek first (WNOWAIT), reap under the lock: until then the pid stays taken by the
            // zombie, which is what makes `signal` safe.
            match waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Ok(status) => {
                    if let Some(pid) = status.pid() {
                        self.reap(pid);
                    }
                }
                Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => {
                    // No child at all: nothing can exit (or be re-parented to us) until one is
                    // started.
                    let state = self.state.lock().unwrap();
                    let _unused = self
                        .spawned
                        .wait_while(state, |s| s.spawns == spawns)
                        .unwrap();
                }
                Err(e) => {
                    tracing::error!(error = %e, "waitid failed; the reaper stops");
                    return;
                }
            }
        }
    }

    fn reap(&self, pid: Pid) {
        let mut state = self.state.lock().unwrap();
        let status = match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => ExitStatus::from_raw((code & 0xff) << 8),
            Ok(WaitStatus::Signaled(_, sig, _)) => ExitStatus::from_raw(sig as i32),
            _ => return,
        };
        let pid = pid.as_raw();
        match state.watched.remove(&pid) {
            Some(tx) => {
                let _ = tx.send(status);
            }
            None => {
                tracing::debug!(pid, ?status, "reaped a process nobody watches");
                if state.unclaimed.len() == UNCLAIMED_KEPT {
                    state.unclaimed.pop_front();
                }
                state.unclaimed.push_back((pid, status));
            }
        }
    }
}

/// A process, told apart from a later one with the same pid by when it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    pub pid: i32,
    /// Clock ticks after boot (`/proc/PID/stat`, field 22).
    started: u64,
}

/// This process's children, from `/proc` (its own PID namespace's view).
fn own_children() -> Vec<ProcessId> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(child_of_mine)
        .collect()
}

/// `pid`, if it is a child of this process.
fn child_of_mine(pid: i32) -> Option<ProcessId> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (parent, started) = parent_and_start(&stat)?;
    (parent == std::process::id() as i32).then_some(ProcessId { pid, started })
}

/// The parent pid and start time in a `/proc/PID/stat` line. The command name may hold any
/// character, a `)` included: the fields are counted after its last `)`.
fn parent_and_start(stat: &str) -> Option<(i32, u64)> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // Fields 3 (state) and 4 (ppid), then 22 (starttime): the 2nd and the 20th after the name.
    let parent = fields.nth(1)?.parse().ok()?;
    let started = fields.nth(17)?.parse().ok()?;
    Some((parent, started))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::LaunchMode;
    use crate::task_host::prefork_launcher::tests::{prefork_in, ready};
    use crate::task_host::task_process::Exit;
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    /// Whether the process is gone from /proc altogether (exited and reaped, not a zombie).
    pub(crate) async fn reaped(pid: i32, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// A shell that starts a background grandchild, tells its pid, and exits after `linger`.
    fn shell_with_grandchild(
        linger: &str,
        grandchild: &str,
    ) -> (i32, oneshot::Receiver<ExitStatus>) {
        let (mut shell, exit) = Reaper::global()
            .spawn(
                Command::new("sh")
                    .args(["-c", &format!("{grandchild} & echo $!; sleep {linger}")])
                    .stdout(Stdio::piped()),
            )
            .unwrap();
        let mut out = String::new();
        BufReader::new(shell.stdout.take().unwrap())
            .read_line(&mut out)
            .unwrap();
        (out.trim().parse().unwrap(), exit)
    }

    #[test]
    fn a_stat_line_is_read_after_the_last_parenthesis_of_the_name() {
        let stat = "42 (a) b) (c) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(parent_and_start(stat), Some((7, 98765)));
        assert_eq!(parent_and_start("42 (cut"), None);
    }

    #[tokio::test]
    async fn what_nobody_watches_is_signalled_and_what_is_watched_is_not() {
        // A grandchild re-parented to us when the shell between exits: nobody watches it.
        let (grandchild, shell) = shell_with_grandchild("0", "sleep 30");
        assert!(shell.await.unwrap().success());
        let reaper = Reaper::global();
        let leftover = loop {
            if let Some(p) = reaper
                .unwatched_children()
                .into_iter()
                .find(|p| p.pid == grandchild)
            {
                break p;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let (watched, _exit) = reaper.spawn(Command::new("sleep").arg("30")).unwrap();
        assert!(!reaper
            .unwatched_children()
            .iter()
            .any(|p| p.pid == watched.id() as i32));
        assert!(reaper.signal_unwatched_child(leftover, Signal::SIGKILL));
        assert!(reaped(grandchild, Duration::from_secs(10)).await);
        assert!(
            !reaper.signal_unwatched_child(leftover, Signal::SIGKILL),
            "gone, so not signalled again"
        );
        assert!(reaper.signal(watched.id() as i32, Signal::SIGKILL));
    }

    #[tokio::test]
    async fn a_task_watched_before_it_is_re_parented_to_us_is_still_waited_for() {
        // The grandchild is someone else's child when it is watched, and ours afterwards.
        let (grandchild, shell) = shell_with_grandchild("0.3", "sleep 1");
        let exit = Reaper::global().watch(grandchild);
        assert!(shell.await.unwrap().success());
        let status = tokio::time::timeout(Duration::from_secs(10), exit)
            .await
            .expect("the grandchild's exit is reported")
            .unwrap();
        assert!(status.success(), "{status:?}");
    }

    #[tokio::test]
    async fn a_status_reaped_before_it_is_watched_is_kept() {
        let (grandchild, shell) = shell_with_grandchild("0", "sh -c 'sleep 0.3; exit 5'");
        assert!(shell.await.unwrap().success());
        assert!(reaped(grandchild, Duration::from_secs(3)).await);
        let status = Reaper::global().watch(grandchild).await.unwrap();
        assert_eq!(status.code(), Some(5));
    }

    #[tokio::test]
    async fn what_a_child_leaves_behind_is_reaped_too() {
        let (grandchild, shell) = shell_with_grandchild("0", "sleep 0.2");
        assert!(shell.await.unwrap().success());
        assert!(
            reaped(grandchild, Duration::from_secs(3)).await,
            "the background child {grandchild} stayed a zombie"
        );
    }

    #[tokio::test]
    async fn a_pid_that_is_gone_counts_as_failed() {
        let (child, exit) = Reaper::global().spawn(&mut Command::new("true")).unwrap();
        assert!(exit.await.unwrap().success());
        // Its status went to its first watcher: nothing is left to report it again.
        let status = Reaper::global().watch(child.id() as i32).await.unwrap();
        assert_eq!(status.code(), Some(127));
    }

    /// Runs `count` tasks, `at_once` at a time, each leaving a child that outlives it by a
    /// moment; every one of those children is reaped within 3 s of its task's end.
    async fn tasks_leaving_children_leave_no_zombie(
        mode: LaunchMode,
        count: usize,
        at_once: usize,
    ) {
        let pf = prefork_in(mode, true);
        if mode == LaunchMode::Prefork {
            ready(&pf.spawner.prefork_launcher().unwrap()).await;
        }
        let mut left = Vec::new();
        for batch in (0..count).collect::<Vec<_>>().chunks(at_once) {
            let mut running = Vec::new();
            for i in batch {
                let mut workload = pf.workload(&format!("t{i}"), 0.0, 0);
                workload["leave_child"] = 0.1.into();
                running.push(pf.spawner.spawn(&workload).await.unwrap());
            }
            for mut p in running {
                let exit = p.wait(&CancellationToken::new()).await.unwrap();
                assert!(matches!(exit, Exit::Finished(s) if s.success()), "{exit:?}");
                assert_eq!(p.launched_by(), mode);
            }
            for i in batch {
                left.push(pf.record(&format!("t{i}"))["left"].as_i64().unwrap() as i32);
            }
        }
        for pid in left {
            assert!(
                reaped(pid, Duration::from_secs(3)).await,
                "the child {pid} a task left behind is still there (a zombie?)"
            );
        }
    }

    #[tokio::test]
    async fn a_child_a_task_leaves_behind_is_reaped() {
        tasks_leaving_children_leave_no_zombie(LaunchMode::Prefork, 1, 1).await;
        tasks_leaving_children_leave_no_zombie(LaunchMode::Fresh, 1, 1).await;
    }

    #[tokio::test]
    async fn two_hundred_tasks_leave_no_zombie() {
        tasks_leaving_children_leave_no_zombie(LaunchMode::Prefork, 200, 8).await;
    }
}
