//! Starting a task process.
//!
//! The task runs in Airflow's own supervisor (`airflow.sdk.execution_time.execute_workload`),
//! in a process group of its own so that a stop reaches the supervisor and the task it forked.
//! Both ways to start it ([`LaunchMode`]) go through the launcher script
//! (`agent/python/astro_launcher.py`, run as in [`launcher_script`]): a fork of the pre-forked
//! launcher, which has Airflow imported already, or a fresh interpreter running the script for
//! one task — the fallback whenever the launcher cannot start a task. The workload (it holds
//! the task's Execution API token) travels in the request, never in a file or argv: the tasks
//! run as the same user, and every process the request passes through makes itself
//! non-dumpable first, so no other task can read it through `/proc`. The process gets the
//! allowlisted environment of [`crate::task_env`] plus the settings below, and its link to the
//! task host ([`TaskOutput`]: its stdout and stderr, and the claim that decides races between
//! the two ways) is a socket, no file in any folder.

use super::launcher_protocol::LaunchRequest;
use super::launcher_script;
use super::prefork_launcher::PreforkLauncher;
use super::reaper::Reaper;
use super::task_output::TaskOutput;
use super::task_process::TaskProcess;
use crate::config::LaunchMode;
use crate::frames;
use nix::sys::signal::Signal;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// How long a fresh interpreter may take to start and say it is ready for its request.
const FRESH_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a task the launcher says it started may take to claim its job: it waits to be
/// re-parented to the task host first (its intermediate process exits), milliseconds.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything needed to start task processes, computed once.
pub struct TaskSpawner {
    python: PathBuf,
    env: Vec<(OsString, OsString)>,
    reaper: &'static Reaper,
    prefork: Option<Arc<PreforkLauncher>>,
}

pub struct SpawnerSettings<'a> {
    pub python: &'a Path,
    pub execution_api_url: &'a str,
    pub worker_name: &'a str,
    pub log_folder: &'a Path,
    pub mode: LaunchMode,
    /// Tasks that may run at once (the pre-fork launcher keeps that many processes ready).
    pub slots: u32,
}

impl TaskSpawner {
    /// `inherited_env` is what tasks inherit ([`crate::task_env::inherited`]).
    pub fn new(
        settings: SpawnerSettings<'_>,
        inherited_env: impl Iterator<Item = (OsString, OsString)>,
    ) -> Self {
        let SpawnerSettings {
            python,
            execution_api_url,
            worker_name,
            log_folder,
            mode,
            slots,
        } = settings;
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
        TaskSpawner {
            python: python.to_path_buf(),
            env,
            reaper,
            prefork,
        }
    }

    /// The launcher to keep running, in pre-fork mode.
    pub fn prefork_launcher(&self) -> Option<Arc<PreforkLauncher>> {
        self.prefork.clone()
    }

    /// Starts the task for `workload` (the job's `command`).
    pub async fn spawn(&self, workload: &serde_json::Value) -> std::io::Result<TaskProcess> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let request = LaunchRequest {
            id: &id,
            host: std::process::id(),
            workload,
        };
        if let Some(launcher) = &self.prefork {
            let (mut output, theirs) = TaskOutput::pair()?;
            match launcher.launch(&request, theirs).await {
                Ok(pid) => match output.claim(CLAIM_TIMEOUT).await {
                    Some(claimed) if claimed == pid => {
                        output.go().await?;
                        return Ok(self.adopted(pid, output));
                    }
                    claimed => {
                        tracing::warn!(
                            pid,
                            ?claimed,
                            "the launcher's task did not claim its job; starting it in a fresh interpreter"
                        );
                        self.reaper.signal(pid, Signal::SIGKILL);
                    }
                },
                Err(reason) => {
                    tracing::warn!("{reason}; starting the task in a fresh interpreter");
                    // The launcher may have forked the task before it failed: its claim tells.
                    if let Some(pid) = output.claimed_now() {
                        tracing::info!(
                            pid,
                            "the launcher had started the task after all; adopting it"
                        );
                        output.go().await?;
                        return Ok(self.adopted(pid, output));
                    }
                }
            }
            // Closed unanswered: a task that claims the job now reads the end and exits unrun.
            drop(output);
        }
        self.spawn_fresh(&request).await
    }

    /// A fresh interpreter runs the launcher script for this one task. It gets its request on
    /// a socket as stdin, and only once it has said it is not dumpable.
    async fn spawn_fresh(&self, request: &LaunchRequest<'_>) -> std::io::Result<TaskProcess> {
        let (output, theirs) = TaskOutput::pair()?;
        let (ours, stdin) = std::os::unix::net::UnixStream::pair()?;
        let (child, exit) = self.reaper.spawn(
            launcher_script::command(&self.python, "--one")
                .env_clear()
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::from(OwnedFd::from(stdin)))
                .stdout(Stdio::from(theirs.try_clone()?))
                .stderr(Stdio::from(theirs))
                .process_group(0),
        )?;
        let pid = child.id() as i32;
        let process = TaskProcess::new(pid, LaunchMode::Fresh, exit, self.reaper, output);
        ours.set_nonblocking(true)?;
        let ours = tokio::net::UnixStream::from_std(ours)?;
        let (mut read, write) = ours.into_split();
        let handshake = async {
            let mut ready = [0u8; 1];
            read.read_exact(&mut ready).await?;
            frames::send(&mut frames::writer(write), request).await
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
    fn adopted(&self, pid: i32, output: TaskOutput) -> TaskProcess {
        TaskProcess::new(
            pid,
            LaunchMode::Prefork,
            self.reaper.watch(pid),
            self.reaper,
            output,
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::task_process::Exit;
    use super::*;
    use crate::task_env::EnvPattern;
    use std::os::unix::fs::PermissionsExt;
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

    pub(crate) fn settings(python: &Path, mode: LaunchMode) -> SpawnerSettings<'_> {
        SpawnerSettings {
            python,
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
            settings(python, LaunchMode::Fresh),
            crate::task_env::inherited(parent.into_iter(), &allowed).into_iter(),
        )
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
    }

    #[tokio::test]
    async fn the_supervisors_output_reaches_no_file_and_its_tail_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(dir.path());
        // 200 KiB, more than is kept; then what the supervisor says last.
        let spawner = fresh_spawner(
            dir.path(),
            &python,
            "head -c 204800 /dev/zero | tr '\\0' x; echo; echo last-words >&2; ls -l /proc/$$/fd/ > \"$RECORD.fds\"; true",
        );
        let mut p = spawner.spawn(&serde_json::json!({})).await.unwrap();
        let exit = p.wait(&CancellationToken::new()).await.unwrap();
        assert!(matches!(exit, Exit::Finished(s) if s.success()), "{exit:?}");
        let tail = p.output_tail(1024);
        // stdout's and stderr's last bytes, and no more than asked for.
        assert!(
            tail.starts_with('x') && tail.ends_with("x\nlast-words\n"),
            "{tail:?}"
        );
        assert_eq!(tail.len(), 1024);
        // Its stderr (and stdout, the same) is a socket: nothing to open by name, or again
        // through /proc. (The shell's stdout is the record file while `ls` runs.)
        let fds = std::fs::read_to_string(dir.path().join("rec.fds")).unwrap();
        assert!(fds.contains(" 2 -> socket:["), "{fds}");
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
    }
}
