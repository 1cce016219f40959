//! Starting and stopping one task process.
//!
//! The task runs in Airflow's own supervisor, the code behind
//! `python -m airflow.sdk.execution_time.execute_workload --json-path FILE`, in a process group
//! of its own so that a stop reaches the supervisor and the task it forked. The workload (it
//! holds the task's Execution API token) goes into a 0600 file rather than argv, where `ps`
//! would show it, and the process gets the allowlisted environment of [`crate::task_env`]
//! plus the settings below.
//!
//! Two ways to start it ([`LaunchMode`]): a fork of the pre-forked launcher, which has Airflow
//! imported already, or a fresh interpreter — the fallback whenever the launcher cannot start
//! a task. A claim file decides races between the two: whoever creates it first runs the task.

use crate::prefork_launcher::{LaunchRequest, PreforkLauncher};
use crate::reaper::Reaper;
use nix::sys::signal::Signal;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// How long a task gets between SIGTERM and SIGKILL when the agent must stop it.
pub const KILL_GRACE: Duration = Duration::from_secs(10);

/// How task processes are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LaunchMode {
    /// Fork from a long-lived launcher that has imported Airflow already (fresh interpreters
    /// while it is not available).
    Prefork,
    /// A fresh `python -m airflow.sdk.execution_time.execute_workload` per task.
    Fresh,
}

/// Everything needed to start task processes, computed once.
pub struct TaskSpawner {
    python: PathBuf,
    /// Removed with everything in it when the spawner is dropped.
    work_dir: tempfile::TempDir,
    env: Vec<(OsString, OsString)>,
    reaper: &'static Reaper,
    prefork: Option<Arc<PreforkLauncher>>,
}

pub struct SpawnerSettings<'a> {
    pub python: &'a Path,
    /// Where the private work directory is made (the system's temporary directory).
    pub work_dir_in: &'a Path,
    pub execution_api_url: &'a str,
    pub worker_name: &'a str,
    pub log_folder: &'a Path,
    pub mode: LaunchMode,
    /// Tasks that may run at once (the pre-fork launcher keeps that many processes ready).
    pub slots: u32,
}

impl TaskSpawner {
    /// Creates the private work directory that holds workload files: a new directory with a
    /// random name and mode 0700, so that nobody can prepare it (or a symlink in its place)
    /// beforehand. `inherited_env` is what tasks inherit ([`crate::task_env::inherited`]).
    pub fn new(
        settings: SpawnerSettings<'_>,
        inherited_env: impl Iterator<Item = (OsString, OsString)>,
    ) -> std::io::Result<Self> {
        let SpawnerSettings {
            python,
            work_dir_in,
            execution_api_url,
            worker_name,
            log_folder,
            mode,
            slots,
        } = settings;
        let work_dir = tempfile::Builder::new()
            .prefix("astro-agent-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(work_dir_in)?;
        let mut env: Vec<(OsString, OsString)> = inherited_env.collect();
        let set = [
            (
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
                execution_api_url.as_ref(),
            ),
            ("AIRFLOW__LOGGING__BASE_LOG_FOLDER", log_folder.as_os_str()),
            // The task instance shows the worker's name as its host, as with the edge worker,
            // whose hostname callable reads HOSTNAME.
            ("HOSTNAME", worker_name.as_ref()),
            (
                "AIRFLOW__CORE__HOSTNAME_CALLABLE",
                "airflow.providers.edge3.cli.worker._edge_hostname".as_ref(),
            ),
        ];
        env.retain(|(k, _)| !set.iter().any(|(name, _)| k == name));
        env.extend(
            set.iter()
                .map(|(k, v)| (OsString::from(k), v.to_os_string())),
        );
        let reaper = Reaper::global();
        // Forked tasks reach the agent only by re-parenting.
        let prefork = match mode {
            LaunchMode::Prefork if reaper.is_subreaper() => Some(PreforkLauncher::new(
                python,
                work_dir.path(),
                env.clone(),
                reaper,
                slots,
            )?),
            _ => None,
        };
        Ok(TaskSpawner {
            python: python.to_path_buf(),
            work_dir,
            env,
            reaper,
            prefork,
        })
    }

    pub fn work_dir(&self) -> &Path {
        self.work_dir.path()
    }

    /// The launcher to keep running, in pre-fork mode.
    pub fn prefork_launcher(&self) -> Option<Arc<PreforkLauncher>> {
        self.prefork.clone()
    }

    /// Starts the task for `workload` (the job's `command`).
    pub async fn spawn(&self, workload: &serde_json::Value) -> std::io::Result<TaskProcess> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let files = TaskFiles {
            workload: self.work_dir().join(format!("{id}.json")),
            output: self.work_dir().join(format!("{id}.out")),
            claim: self.work_dir().join(format!("{id}.claim")),
        };
        // Written for a process on this machine that reads it at once: no fsync (it would
        // wait for the disk on every task start, and a crash loses the task anyway).
        let mut f = private_file(&files.workload)?;
        f.write_all(&serde_json::to_vec(workload)?)?;
        drop(f);
        let output = private_file(&files.output)?;

        if let Some(launcher) = &self.prefork {
            let request = LaunchRequest {
                id: &id,
                workload: &files.workload,
                output: &files.output,
                claim: &files.claim,
            };
            match launcher.launch(&request).await {
                Ok(pid) => return Ok(self.adopted(pid, files)),
                Err(reason) => tracing::warn!("{reason}; starting the task in a fresh interpreter"),
            }
            // The launcher may have forked the task before it failed: the claim tells.
            if let Some(pid) = claimed_by(&files.claim).await? {
                tracing::info!(
                    pid,
                    "the launcher had started the task after all; adopting it"
                );
                return Ok(self.adopted(pid, files));
            }
        }
        let (child, exit) = self.reaper.spawn(
            Command::new(&self.python)
                .args([
                    "-m",
                    "airflow.sdk.execution_time.execute_workload",
                    "--json-path",
                ])
                .arg(&files.workload)
                .env_clear()
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(output.try_clone()?)
                .stderr(output)
                .process_group(0),
        )?;
        Ok(TaskProcess {
            pid: child.id() as i32,
            launched_by: LaunchMode::Fresh,
            exit,
            reaper: self.reaper,
            files,
        })
    }

    /// A task the launcher forked, re-parented to the agent.
    fn adopted(&self, pid: i32, files: TaskFiles) -> TaskProcess {
        TaskProcess {
            pid,
            launched_by: LaunchMode::Prefork,
            exit: self.reaper.watch(pid),
            reaper: self.reaper,
            files,
        }
    }
}

fn private_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Claims the job for a fresh interpreter, or returns the pid of the launcher's task that
/// claimed it first.
async fn claimed_by(claim: &Path) -> std::io::Result<Option<i32>> {
    match private_file(claim) {
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // The task creates the file, then writes its pid: give it a moment to finish.
            for _ in 0..100 {
                if let Ok(pid) = std::fs::read_to_string(claim)?.trim().parse::<i32>() {
                    return Ok(Some(pid));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(std::io::Error::other(
                "a task claimed the job but wrote no pid",
            ))
        }
        Err(e) => Err(e),
    }
}

/// Files of one task; removed when the task is done with them.
struct TaskFiles {
    workload: PathBuf,
    output: PathBuf,
    claim: PathBuf,
}

impl Drop for TaskFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.workload);
        let _ = std::fs::remove_file(&self.output);
        let _ = std::fs::remove_file(&self.claim);
    }
}

pub struct TaskProcess {
    pid: i32,
    launched_by: LaunchMode,
    exit: oneshot::Receiver<ExitStatus>,
    reaper: &'static Reaper,
    files: TaskFiles,
}

impl TaskProcess {
    /// What started the task: `Prefork` when the launcher forked it.
    pub fn launched_by(&self) -> LaunchMode {
        self.launched_by
    }
}

/// How a task process ended.
#[derive(Debug)]
pub enum Exit {
    /// It ended by itself.
    Finished(ExitStatus),
    /// The agent stopped it (second signal or drain deadline).
    Killed(ExitStatus),
}

impl TaskProcess {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        (&mut self.exit)
            .await
            .map_err(|_| std::io::Error::other("the reaper stopped before the task ended"))
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

    fn signal(&self, signal: Signal) {
        if !self.reaper.signal_group(self.pid, signal) {
            tracing::debug!(pid = self.pid, %signal, "process group already gone");
        }
    }

    /// The last bytes the supervisor printed (its own errors land there, not in the task log).
    pub fn output_tail(&self, max: u64) -> String {
        let Ok(mut f) = File::open(&self.files.output) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task_env::EnvPattern;
    use nix::unistd::Pid;

    /// A stand-in "python" for fresh mode that records its argv, environment and workload,
    /// then runs the shell snippet in $ACTION.
    fn fake_python(dir: &Path) -> PathBuf {
        let path = dir.join("python");
        std::fs::write(
            &path,
            "#!/bin/sh\necho \"$@\" > \"$RECORD.argv\"\nenv > \"$RECORD.env\"\ncat \"$4\" > \"$RECORD.workload\"\nstat -c %a \"$4\" > \"$RECORD.mode\"\necho supervisor-says-hi\neval \"$ACTION\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn settings<'a>(python: &'a Path, dir: &'a Path, mode: LaunchMode) -> SpawnerSettings<'a> {
        SpawnerSettings {
            python,
            work_dir_in: dir,
            execution_api_url: "http://api:8080/execution/",
            worker_name: "worker-7",
            log_folder: Path::new("/logs"),
            mode,
            slots: 2,
        }
    }

    fn fresh_spawner(dir: &Path, python: &Path, action: &str) -> TaskSpawner {
        let parent = vec![
            ("PATH".into(), std::env::var_os("PATH").unwrap()),
            ("RECORD".into(), dir.join("rec").into_os_string()),
            ("ACTION".into(), action.into()),
            ("ASTRO_AGENT_JWT_SECRET".into(), "agent-secret".into()),
            (
                "AIRFLOW__API_AUTH__JWT_SECRET".into(),
                "airflow-secret".into(),
            ),
            (
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN".into(),
                "postgresql://x".into(),
            ),
            ("AIRFLOW__CORE__DAGS_FOLDER".into(), "/dags".into()),
            ("HOSTNAME".into(), "pod-name".into()),
            ("UNLISTED_TOKEN".into(), "unlisted-secret".into()),
        ];
        // As the agent builds it: the allowlist, with what the fake supervisor reads added.
        let allowed = ["RECORD", "ACTION"].map(|name| EnvPattern::parse(name).unwrap());
        TaskSpawner::new(
            settings(python, dir, LaunchMode::Fresh),
            crate::task_env::inherited(parent.into_iter(), &allowed).into_iter(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn runs_the_supervisor_with_a_private_workload_and_clean_env() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(dir.path());
        let spawner = fresh_spawner(dir.path(), &python, "exit 0");
        let workload = serde_json::json!({"type": "ExecuteTask", "token": "tok"});
        let mut p = spawner.spawn(&workload).await.unwrap();
        let exit = p.wait(&CancellationToken::new()).await.unwrap();
        assert!(matches!(exit, Exit::Finished(s) if s.success()));
        let rec =
            |ext: &str| std::fs::read_to_string(dir.path().join(format!("rec.{ext}"))).unwrap();
        assert!(
            rec("argv").starts_with("-m airflow.sdk.execution_time.execute_workload --json-path ")
        );
        assert_eq!(rec("mode").trim(), "600");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&rec("workload")).unwrap(),
            workload
        );
        let env = rec("env");
        assert!(env.contains("AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://api:8080/execution/"));
        assert!(env.contains("HOSTNAME=worker-7"));
        assert!(env.contains("AIRFLOW__LOGGING__BASE_LOG_FOLDER=/logs"));
        assert!(env.contains("AIRFLOW__CORE__DAGS_FOLDER=/dags"));
        for withheld in [
            "agent-secret",
            "airflow-secret",
            "postgresql://x",
            "unlisted-secret",
        ] {
            assert!(
                !env.contains(withheld),
                "{withheld} leaked into the task env:\n{env}"
            );
        }
        assert!(p.output_tail(1024).contains("supervisor-says-hi"));
        drop(p);
        let left: Vec<_> = std::fs::read_dir(spawner.work_dir()).unwrap().collect();
        assert!(left.is_empty(), "task files are removed: {left:?}");
        let mode = std::fs::metadata(spawner.work_dir())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[tokio::test]
    async fn the_work_dir_is_new_private_and_unpredictable() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(dir.path());
        // What someone preparing the agent's directory would have guessed.
        let guess = dir
            .path()
            .join(format!("astro-agent-{}", std::process::id()));
        std::os::unix::fs::symlink("/", &guess).unwrap();
        let a = fresh_spawner(dir.path(), &python, "exit 0");
        let b = fresh_spawner(dir.path(), &python, "exit 0");
        assert_ne!(a.work_dir(), b.work_dir());
        for spawner in [&a, &b] {
            assert_ne!(spawner.work_dir(), guess);
            let meta = std::fs::symlink_metadata(spawner.work_dir()).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        }
        let work_dir = a.work_dir().to_path_buf();
        drop(a);
        assert!(!work_dir.exists(), "removed with its spawner");
    }

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
    async fn gone(pid: i32) -> bool {
        for _ in 0..300 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_missing_python_fails_to_spawn() {
        let dir = tempfile::tempdir().unwrap();
        let spawner = fresh_spawner(dir.path(), Path::new("/nonexistent/python3"), "");
        let err = spawner
            .spawn(&serde_json::json!({}))
            .await
            .err()
            .expect("spawn fails");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(std::fs::read_dir(spawner.work_dir()).unwrap().count(), 0);
    }

    // ---- pre-fork mode, with the real launcher script and a fake `airflow` package ----

    const FAKE_EXECUTE_WORKLOAD: &str = r#"
import argparse, json, os, sys, time
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json-path")
    args = parser.parse_args()
    w = json.load(open(args.json_path))
    record = {"pid": os.getpid(), "pgid": os.getpgid(0),
              "main": os.path.basename(getattr(sys.modules["__main__"], "__file__", "")),
              "secret": os.environ.get("AIRFLOW__API_AUTH__JWT_SECRET")}
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

    struct Prefork {
        spawner: TaskSpawner,
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
    fn prefork_in(mode: LaunchMode, with_sdk_log: bool) -> Prefork {
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
            settings(&python, dir.path(), mode),
            crate::task_env::inherited(parent.into_iter(), &[]).into_iter(),
        )
        .unwrap();
        let stop = CancellationToken::new();
        if let Some(launcher) = spawner.prefork_launcher() {
            tokio::spawn(launcher.supervise(stop.clone()));
        }
        Prefork { spawner, stop, dir }
    }

    impl Prefork {
        fn workload(&self, name: &str, sleep: f64, exit: i32) -> serde_json::Value {
            let record = self.dir.path().join(format!("{name}.record"));
            serde_json::json!({"record": record, "sleep": sleep, "exit": exit})
        }

        fn record(&self, name: &str) -> serde_json::Value {
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

    async fn ready(launcher: &PreforkLauncher) {
        tokio::time::timeout(Duration::from_secs(30), launcher.wait_ready())
            .await
            .expect("launcher ready");
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
        assert_eq!(
            rec["main"], "astro_launcher.py",
            "forked from the launcher: {rec}"
        );
        assert_eq!(rec["pid"], rec["pgid"], "its own process group");
        assert_eq!(rec["pid"].as_i64(), Some(p.pid() as i64));
        assert_eq!(
            rec["secret"],
            serde_json::Value::Null,
            "no JWT secret in the launcher's env"
        );
        assert!(p.output_tail(1024).contains("fake supervisor running"));
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
        ready(&launcher).await;
        let first_pid = launcher.pid();
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
            while launcher.pid() == first_pid {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("a new launcher is started");
        ready(&launcher).await;
        let (_, status) = pf.run("after", 0.0, 0).await;
        assert!(status.success());
        assert_eq!(pf.record("after")["main"], "astro_launcher.py");
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
        ready(&launcher).await;
        let launcher_pid = launcher.pid();
        let agent = std::process::id() as i32;
        // settings(): 2 slots, so 2 spares, each re-parented to the agent once the intermediate
        // process that forked it has exited.
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
                crate::reaper::tests::reaped(pid, Duration::from_secs(3)).await,
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

    #[tokio::test]
    async fn a_launcher_that_cannot_start_falls_back_to_fresh_interpreters() {
        let pf = prefork(false); // the launcher's imports fail; execute_workload itself works
        let (_, status) = pf.run("fallback", 0.0, 0).await;
        assert!(status.success());
        assert_eq!(pf.record("fallback")["main"], "execute_workload.py");
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

    #[tokio::test]
    async fn a_claimed_job_is_adopted_not_started_twice() {
        let dir = tempfile::tempdir().unwrap();
        let claim = dir.path().join("x.claim");
        assert_eq!(claimed_by(&claim).await.unwrap(), None, "first claim wins");
        std::fs::write(&claim, "4242").unwrap();
        let other = dir.path().join("y.claim");
        std::fs::write(&other, "4242").unwrap();
        assert_eq!(claimed_by(&other).await.unwrap(), Some(4242));
    }
}
