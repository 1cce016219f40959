//! The task host's state: the settings tasks start with, the tasks it runs or ran (until the
//! agent releases them), and the agent connection that hears about them.

use super::task_process::Exit;
use super::task_spawner::{SpawnerSettings, TaskSpawner};
use super::token_redaction::redact_tokens;
use super::versions_probe;
use crate::config::LaunchMode;
use crate::task_env::{self, EnvPattern};
use crate::task_host_protocol::{DetectedVersions, FromHost, HostedTask, TaskExit, TaskSettings};
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How much of the supervisor's output an exit report carries.
const OUTPUT_TAIL: usize = 16 * 1024;

pub struct Host {
    /// The task host's own environment: what tasks may inherit, through the allowlist.
    environment: Vec<(OsString, OsString)>,
    state: Mutex<State>,
    /// Stops every running task (SIGTERM, then SIGKILL): the task host is shutting down.
    pub stop_tasks: CancellationToken,
    /// Every task's watcher: the task host exits once they have all ended.
    pub watchers: TaskTracker,
}

#[derive(Default)]
struct State {
    spawner: Option<Running>,
    tasks: HashMap<String, Entry>,
    /// Where events go: the connected agent's outbox, and which connection that is.
    agent: Option<(u64, UnboundedSender<FromHost>)>,
    connections: u64,
}

/// A spawner and the launcher it keeps running, for one set of settings.
struct Running {
    settings: TaskSettings,
    spawner: Arc<TaskSpawner>,
    versions: DetectedVersions,
    stop_launcher: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop_launcher.cancel();
    }
}

struct Entry {
    job: serde_json::Value,
    pid: i32,
    mode: LaunchMode,
    exit: Option<TaskExit>,
}

impl Host {
    pub fn new(environment: Vec<(OsString, OsString)>) -> Arc<Host> {
        Arc::new(Host {
            environment,
            state: Mutex::new(State::default()),
            stop_tasks: CancellationToken::new(),
            watchers: TaskTracker::new(),
        })
    }

    /// Takes the agent's settings (a new spawner when they changed; running tasks are not
    /// affected) and makes `outbox` the place events go; what a new agent must learn: the
    /// versions found, every task not released yet, and the connection's number.
    pub async fn hello(
        &self,
        settings: TaskSettings,
        outbox: UnboundedSender<FromHost>,
    ) -> Result<(DetectedVersions, Vec<HostedTask>, u64), String> {
        let current = self
            .state
            .lock()
            .unwrap()
            .spawner
            .as_ref()
            .filter(|r| r.settings == settings)
            .map(|r| r.versions.clone());
        let versions = match current {
            Some(versions) => versions,
            None => {
                let running = self.start_spawner(settings).await?;
                let versions = running.versions.clone();
                self.state.lock().unwrap().spawner = Some(running);
                versions
            }
        };
        let mut state = self.state.lock().unwrap();
        state.connections += 1;
        let connection = state.connections;
        // An earlier connection's outbox is dropped here, which ends that session.
        state.agent = Some((connection, outbox));
        let tasks = state
            .tasks
            .iter()
            .map(|(id, e)| HostedTask {
                id: id.clone(),
                job: e.job.clone(),
                pid: e.pid,
                mode: e.mode,
                exit: e.exit.clone(),
            })
            .collect();
        Ok((versions, tasks, connection))
    }

    async fn start_spawner(&self, settings: TaskSettings) -> Result<Running, String> {
        let allowed = settings
            .task_env_allow
            .iter()
            .map(|p| EnvPattern::parse(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("task_env_allow: {e}"))?;
        let env = task_env::inherited(self.environment.iter().cloned(), &allowed);
        let spawner = TaskSpawner::new(
            SpawnerSettings {
                python: &settings.python,
                execution_api_url: &settings.execution_api_url,
                worker_name: &settings.worker_name,
                log_folder: &settings.log_folder,
                mode: settings.mode,
                slots: settings.slots,
            },
            env.iter().cloned(),
        );
        let spawner = Arc::new(spawner);
        let stop_launcher = CancellationToken::new();
        // The launcher imports Airflow (about a second, the longest step before a new worker's
        // first task) while the versions are probed and the agent registers and fetches: a job
        // that arrives before it is ready waits for it (see `PreforkLauncher::launch`).
        if let Some(launcher) = spawner.prefork_launcher() {
            tokio::spawn(launcher.supervise(stop_launcher.clone()));
        }
        let versions = versions_probe::detect(&settings.python, &env).await;
        Ok(Running {
            settings,
            spawner,
            versions,
            stop_launcher,
        })
    }

    /// Forgets `connection`'s outbox if events still go there (its agent went away).
    pub fn detach(&self, connection: u64) {
        let mut state = self.state.lock().unwrap();
        if state.agent.as_ref().is_some_and(|(c, _)| *c == connection) {
            state.agent = None;
        }
    }

    fn tell_agent(state: &State, message: FromHost) {
        if let Some((_, agent)) = &state.agent {
            let _ = agent.send(message);
        }
    }

    /// Starts a task; `started` or `start_failed` goes to the agent, and `exited` when it ends.
    pub async fn start(
        self: Arc<Self>,
        id: String,
        job: serde_json::Value,
        workload: serde_json::Value,
    ) {
        let spawner = self
            .state
            .lock()
            .unwrap()
            .spawner
            .as_ref()
            .map(|r| r.spawner.clone());
        let started = match spawner {
            Some(spawner) if !self.stop_tasks.is_cancelled() => spawner.spawn(&workload).await,
            Some(_) => Err(std::io::Error::other("the task host is shutting down")),
            None => Err(std::io::Error::other("no settings yet: hello first")),
        };
        let mut process = match started {
            Ok(process) => process,
            Err(e) => {
                tracing::error!(task = %id, error = %e, "could not start the task process");
                let state = self.state.lock().unwrap();
                Self::tell_agent(
                    &state,
                    FromHost::StartFailed {
                        id,
                        error: e.to_string(),
                    },
                );
                return;
            }
        };
        let (pid, mode) = (process.pid(), process.launched_by());
        {
            let mut state = self.state.lock().unwrap();
            state.tasks.insert(
                id.clone(),
                Entry {
                    job,
                    pid,
                    mode,
                    exit: None,
                },
            );
            Self::tell_agent(
                &state,
                FromHost::Started {
                    id: id.clone(),
                    pid,
                    mode,
                },
            );
        }
        tracing::info!(task = %id, pid, ?mode, "task started");
        let host = self.clone();
        self.watchers.spawn(async move {
            let exit = match process.wait(&host.stop_tasks).await {
                Ok(Exit::Finished(status) | Exit::Killed(status)) => TaskExit {
                    code: status.code(),
                    signal: status.signal(),
                    // The agent logs it and ships it into failed tasks' logs.
                    output_tail: redact_tokens(&process.output_tail(OUTPUT_TAIL)),
                },
                Err(e) => TaskExit {
                    code: None,
                    signal: None,
                    output_tail: format!("the task host could not wait for the task: {e}"),
                },
            };
            tracing::info!(task = %id, pid, %exit, "task ended");
            drop(process);
            let mut state = host.state.lock().unwrap();
            if let Some(entry) = state.tasks.get_mut(&id) {
                entry.exit = Some(exit.clone());
            }
            Self::tell_agent(&state, FromHost::Exited { id, exit });
        });
    }

    /// Signals a running task's process group.
    pub fn signal(&self, id: &str, signal: nix::sys::signal::Signal) {
        let state = self.state.lock().unwrap();
        match state.tasks.get(id) {
            Some(entry) if entry.exit.is_none() => {
                tracing::info!(task = %id, pid = entry.pid, %signal, "signalling the task");
                if !super::reaper::Reaper::global().signal_group(entry.pid, signal) {
                    tracing::debug!(task = %id, "process group already gone");
                }
            }
            _ => tracing::debug!(task = %id, "no running task to signal"),
        }
    }

    /// Forgets a task whose end the agent has learnt.
    pub fn release(&self, id: &str) {
        let mut state = self.state.lock().unwrap();
        if state.tasks.get(id).is_some_and(|e| e.exit.is_some()) {
            state.tasks.remove(id);
        }
    }

    /// The ids of the tasks still running.
    pub fn running_ids(&self) -> std::collections::HashSet<String> {
        let state = self.state.lock().unwrap();
        state
            .tasks
            .iter()
            .filter(|(_, e)| e.exit.is_none())
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub fn running(&self) -> usize {
        let state = self.state.lock().unwrap();
        state.tasks.values().filter(|e| e.exit.is_none()).count()
    }

    /// Stops the launcher (running tasks are not its children and keep going).
    pub fn stop_launcher(&self) {
        self.state.lock().unwrap().spawner = None;
    }
}
