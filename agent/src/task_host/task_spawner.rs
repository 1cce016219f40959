//! Starting a task process.
//!
//! The task runs in Airflow's own supervisor (`airflow.sdk.execution_time.execute_workload`),
//! in a process group of its own so that a stop reaches the supervisor and the task it forked.
//! Both ways to start it ([`LaunchMode`]) go through the launcher script
//! (`agent/python/astro_launcher.py`, run as in [`launcher_script`]): a fork of the pre-forked
//! launcher, which has Airflow imported already, or a fresh interpreter running the script for
//! one task — the fallback
//! whenever the launcher cannot start a task. The workload (it holds the task's Execution API
//! token) travels in the request, never in a file or argv: the tasks run as the same user, and
//! every process the request passes through makes itself non-dumpable first, so no other task
//! can read it through `/proc`. The process gets the allowlisted environment of
//! [`crate::task_env`] plus the settings below. A claim file decides races between the two
//! ways: whoever creates it first runs the task.

use super::launcher_protocol::LaunchRequest;
use super::launcher_script;
use super::prefork_launcher::PreforkLauncher;
use super::reaper::Reaper;
use super::task_process::TaskProcess;
use crate::config::LaunchMode;
use crate::frames;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// How long a fresh interpreter may take to start and say it is ready for its request.
const FRESH_READY_TIMEOUT: Duration = Duration::from_secs(120);

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
    /// Creates the private work directory: a new directory with a random name and mode 0700,
    /// so that nobody can prepare it (or a symlink in its place) beforehand.
    /// `inherited_env` is what tasks inherit ([`crate::task_env::inherited`]).
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
            // whose hostname callable reads HOSTNAME (the launcher's does the same).
            ("HOSTNAME", worker_name.as_ref()),
        ];
        env.retain(|(k, _)| !set.iter().any(|(name, _)| k == name));
        env.extend(
            set.iter()
                .map(|(k, v)| (OsString::from(k), v.to_os_string())),
        );
        let reaper = Reaper::global();
        // Forked tasks reach the task host only by re-parenting.
        let prefork = match mode {
            LaunchMode::Prefork if reaper.is_subreaper() => {
                Some(PreforkLauncher::new(python, env.clone(), reaper, slots))
            }
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
        let output_path = self.work_dir().join(format!("{id}.out"));
        let output = private_file(&output_path)?;
        let files = TaskFiles {
            output: File::open(&output_path)?,
            output_path,
            claim: self.work_dir().join(format!("{id}.claim")),
        };

        if let Some(launcher) = &self.prefork {
            let request = LaunchRequest {
                id: &id,
                host: std::process::id(),
                workload,
                output: Some(&files.output_path),
                claim: Some(&files.claim),
            };
            match launcher.launch(&request).await {
                Ok(pid) => return Ok(self.adopted(pid, files)),
                Err(reason) => tracing::warn!("{reason}; starting the task in a fresh interpreter"),
            }
            // The launcher may have forked the task before it failed: the claim tells.
            if let Some(pid) = claimed_by(&files.claim)? {
                tracing::info!(
                    pid,
                    "the launcher had started the task after all; adopting it"
                );
                return Ok(self.adopted(pid, files));
            }
        }
        self.spawn_fresh(&id, workload, output, files).await
    }

    /// A fresh interpreter runs the launcher script for this one task. It gets its request on
    /// a socket as stdin, and only once it has said it is not dumpable.
    async fn spawn_fresh(
        &self,
        id: &str,
        workload: &serde_json::Value,
        output: File,
        files: TaskFiles,
    ) -> std::io::Result<TaskProcess> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let (child, exit) = self.reaper.spawn(
            launcher_script::command(&self.python, "--one")
                .env_clear()
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::from(OwnedFd::from(theirs)))
                .stdout(output.try_clone()?)
                .stderr(output)
                .process_group(0),
        )?;
        let pid = child.id() as i32;
        // The child has the file open: no other process needs its name.
        let _ = std::fs::remove_file(&files.output_path);
        let process = TaskProcess::new(pid, LaunchMode::Fresh, exit, self.reaper, files);
        ours.set_nonblocking(true)?;
        let ours = tokio::net::UnixStream::from_std(ours)?;
        let (mut read, write) = ours.into_split();
        let handshake = async {
            let mut ready = [0u8; 1];
            read.read_exact(&mut ready).await?;
            let request = LaunchRequest {
                id,
                host: std::process::id(),
                workload,
                output: None,
                claim: None,
            };
            frames::send(&mut frames::writer(write), &request).await
        };
        match tokio::time::timeout(FRESH_READY_TIMEOUT, handshake).await {
            Ok(Ok(())) => Ok(process),
            failed => {
                process.kill();
                Err(std::io::Error::other(format!(
                    "the fresh interpreter did not take its task: {}",
                    match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {FRESH_READY_TIMEOUT:?}"),
                    }
                )))
            }
        }
    }

    /// A task the launcher forked, re-parented to the task host.
    fn adopted(&self, pid: i32, files: TaskFiles) -> TaskProcess {
        TaskProcess::new(
            pid,
            LaunchMode::Prefork,
            self.reaper.watch(pid),
            self.reaper,
            files,
        )
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
/// claimed it first. A task links its claim into place with its pid already written, so a
/// claim that exists is complete.
fn claimed_by(claim: &Path) -> std::io::Result<Option<i32>> {
    match private_file(claim) {
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = std::fs::read_to_string(claim)?;
            let pid = text.trim().parse().map_err(|_| {
                std::io::Error::other(format!("a task claimed the job but wrote no pid: {text:?}"))
            })?;
            Ok(Some(pid))
        }
        Err(e) => Err(e),
    }
}

/// Files of one task; the task process keeps them, and they are removed when it is dropped.
pub struct TaskFiles {
    /// The supervisor's stdout and stderr, open for reading: its name goes as soon as the task
    /// has opened it, so other tasks cannot read it.
    pub output: File,
    output_path: PathBuf,
    claim: PathBuf,
}

impl Drop for TaskFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.output_path);
        let _ = std::fs::remove_file(&self.claim);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::task_process::Exit;
    use super::*;
    use crate::task_env::EnvPattern;
    use tokio_util::sync::CancellationToken;

    /// A stand-in "python" for fresh mode that records its argv and environment, says it is
    /// ready on its stdin socket, records the request it then gets, and runs $ACTION.
    pub(crate) fn fake_python(dir: &Path) -> PathBuf {
        let path = dir.join("python");
        std::fs::write(
            &path,
            "#!/bin/sh\necho \"$@\" > \"$RECORD.argv\"\nenv > \"$RECORD.env\"\nprintf '!' >&0\ntail -c +5 <&0 > \"$RECORD.request\"\necho supervisor-says-hi\neval \"$ACTION\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    pub(crate) fn settings<'a>(
        python: &'a Path,
        dir: &'a Path,
        mode: LaunchMode,
    ) -> SpawnerSettings<'a> {
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

    pub(crate) fn fresh_spawner(dir: &Path, python: &Path, action: &str) -> TaskSpawner {
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
        // The launcher's source in argv: no file of it that a task could rewrite.
        assert!(
            rec("argv") == format!("-c {} astro-launcher --one\n", launcher_script::SOURCE),
            "argv: {:.200}",
            rec("argv")
        );
        let request: serde_json::Value = serde_json::from_str(&rec("request")).unwrap();
        assert_eq!(request["workload"], workload, "{request}");
        assert_eq!(request["claim"], serde_json::Value::Null, "{request}");
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
        let left: Vec<_> = std::fs::read_dir(spawner.work_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
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
    async fn a_missing_python_fails_to_spawn() {
        let dir = tempfile::tempdir().unwrap();
        let spawner = fresh_spawner(dir.path(), Path::new("/nonexistent/python3"), "");
        let err = spawner
            .spawn(&serde_json::json!({}))
            .await
            .err()
            .expect("spawn fails");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(
            std::fs::read_dir(spawner.work_dir()).unwrap().count(),
            0,
            "nothing left behind"
        );
    }

    #[test]
    fn a_claimed_job_is_adopted_not_started_twice() {
        let dir = tempfile::tempdir().unwrap();
        let claim = dir.path().join("x.claim");
        assert_eq!(claimed_by(&claim).unwrap(), None, "first claim wins");
        assert!(
            claimed_by(&claim).is_err(),
            "the agent's claim names no task"
        );
        let other = dir.path().join("y.claim");
        std::fs::write(&other, "4242").unwrap();
        assert_eq!(claimed_by(&other).unwrap(), Some(4242));
    }
}
