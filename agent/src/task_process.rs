//! Starting and stopping one task process.
//!
//! The task runs in Airflow's own supervisor,
//! `python -m airflow.sdk.execution_time.execute_workload --json-path FILE`, in a process group
//! of its own so that a stop reaches the supervisor and the task it forked. The workload (it
//! holds the task's Execution API token) goes into a 0600 file rather than argv, where `ps`
//! would show it, and the process gets the agent's environment minus every secret the task
//! must not see: the agent's own settings, Airflow's JWT secret and any database URL.

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// How long a task gets between SIGTERM and SIGKILL when the agent must stop it.
pub const KILL_GRACE: Duration = Duration::from_secs(10);

/// Environment variables a task never inherits (matched by prefix, which also covers
/// Airflow's `_CMD` and `_SECRET` variants).
const WITHHELD_ENV_PREFIXES: &[&str] = &[
    "ASTRO_AGENT_",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CORE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CELERY__RESULT_BACKEND",
];

/// Everything needed to start task processes, computed once.
pub struct Launcher {
    python: PathBuf,
    work_dir: PathBuf,
    env: Vec<(OsString, OsString)>,
}

impl Launcher {
    /// Creates the private work directory (0700) that holds workload files.
    pub fn new(
        python: &Path,
        work_dir: PathBuf,
        execution_api_url: &str,
        worker_name: &str,
        log_folder: &Path,
        parent_env: impl Iterator<Item = (OsString, OsString)>,
    ) -> std::io::Result<Self> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&work_dir)?;
        let mut env: Vec<(OsString, OsString)> = parent_env
            .filter(|(key, _)| {
                let key = key.to_string_lossy();
                !WITHHELD_ENV_PREFIXES.iter().any(|p| key.starts_with(p))
            })
            .collect();
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
        Ok(Launcher {
            python: python.to_path_buf(),
            work_dir,
            env,
        })
    }

    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// Starts the task for `workload` (the job's `command`).
    pub fn spawn(&self, workload: &serde_json::Value) -> std::io::Result<TaskProcess> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let workload_file = self.work_dir.join(format!("{id}.json"));
        let output_file = self.work_dir.join(format!("{id}.out"));
        let files = TaskFiles {
            workload: workload_file.clone(),
            output: output_file.clone(),
        };
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&workload_file)?;
        f.write_all(&serde_json::to_vec(workload)?)?;
        f.sync_all()?;
        drop(f);
        let output = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&output_file)?;
        let child = Command::new(&self.python)
            .args([
                "-m",
                "airflow.sdk.execution_time.execute_workload",
                "--json-path",
            ])
            .arg(&workload_file)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .process_group(0)
            .spawn()?;
        let pid = child.id().expect("a just-spawned child has a pid") as i32;
        Ok(TaskProcess { child, pid, files })
    }
}

/// Files of one task; removed when the task is done with them.
struct TaskFiles {
    workload: PathBuf,
    output: PathBuf,
}

impl Drop for TaskFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.workload);
        let _ = std::fs::remove_file(&self.output);
    }
}

pub struct TaskProcess {
    child: Child,
    pid: i32,
    files: TaskFiles,
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

    /// Waits for the process to end; when `kill` fires first, SIGTERMs its process group
    /// (Airflow's supervisor then marks the task failed, so it can be retried), and SIGKILLs
    /// it after [`KILL_GRACE`].
    pub async fn wait(&mut self, kill: &CancellationToken) -> std::io::Result<Exit> {
        tokio::select! {
            status = self.child.wait() => return status.map(Exit::Finished),
            _ = kill.cancelled() => {}
        }
        self.signal(Signal::SIGTERM);
        match tokio::time::timeout(KILL_GRACE, self.child.wait()).await {
            Ok(status) => status.map(Exit::Killed),
            Err(_) => {
                self.signal(Signal::SIGKILL);
                self.child.wait().await.map(Exit::Killed)
            }
        }
    }

    fn signal(&self, signal: Signal) {
        if let Err(e) = killpg(Pid::from_raw(self.pid), signal) {
            tracing::debug!(pid = self.pid, %signal, error = %e, "process group already gone");
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
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in "python" that records its argv, environment and workload, then runs the
    /// shell snippet in $ACTION.
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

    fn launcher(dir: &Path, action: &str) -> Launcher {
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
        ];
        Launcher::new(
            &fake_python(dir),
            dir.join("work"),
            "http://api:8080/execution/",
            "worker-7",
            Path::new("/logs"),
            parent.into_iter(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn runs_the_supervisor_with_a_private_workload_and_clean_env() {
        let dir = tempfile::tempdir().unwrap();
        let launcher = launcher(dir.path(), "exit 0");
        let workload = serde_json::json!({"type": "ExecuteTask", "token": "tok"});
        let mut p = launcher.spawn(&workload).unwrap();
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
        assert!(
            !env.contains("secret"),
            "a secret leaked into the task env:\n{env}"
        );
        assert!(!env.contains("SQL_ALCHEMY_CONN"));
        assert!(p.output_tail(1024).contains("supervisor-says-hi"));
        drop(p);
        let left: Vec<_> = std::fs::read_dir(launcher.work_dir()).unwrap().collect();
        assert!(left.is_empty(), "workload files are removed: {left:?}");
        let mode = std::fs::metadata(launcher.work_dir())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[tokio::test]
    async fn exit_status_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = launcher(dir.path(), "exit 3")
            .spawn(&serde_json::json!({}))
            .unwrap();
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
        let mut p = launcher(dir.path(), &action)
            .spawn(&serde_json::json!({}))
            .unwrap();
        while !grandchild_pid.exists()
            || std::fs::read_to_string(&grandchild_pid)
                .unwrap()
                .trim()
                .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let gc: i32 = std::fs::read_to_string(&grandchild_pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let kill = CancellationToken::new();
        kill.cancel();
        let exit = tokio::time::timeout(Duration::from_secs(5), p.wait(&kill))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(exit, Exit::Killed(_)));
        // The grandchild got SIGTERM too (it may linger as a zombie of init briefly).
        let mut gone = false;
        for _ in 0..200 {
            let stat = std::fs::read_to_string(format!("/proc/{gc}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(gone, "grandchild {gc} survived the kill");
    }

    #[test]
    fn a_missing_python_fails_to_spawn() {
        let dir = tempfile::tempdir().unwrap();
        let launcher = Launcher::new(
            Path::new("/nonexistent/python3"),
            dir.path().join("work"),
            "http://x/",
            "w",
            Path::new("/logs"),
            std::iter::empty(),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let err = launcher
            .spawn(&serde_json::json!({}))
            .err()
            .expect("spawn fails");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(std::fs::read_dir(launcher.work_dir()).unwrap().count(), 0);
    }
}
