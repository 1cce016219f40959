//! The agent's side of the task host: starting tasks there, signalling them, learning how they
//! ended; keeping the link up.
//!
//! Socket link (worker Pod): when the connection breaks, the tasks keep running in the tasks
//! container; the agent reconnects, and the welcome says which of them still run and how the
//! others ended. A task the welcome does not list was lost with a restarted task host: it is
//! reported failed with that reason. Child link: the task host's end is the end of its tasks;
//! they are reported failed with its exit status, and a new task host is started.

use crate::config::LaunchMode;
use crate::frames;
use crate::task_host_link::{Connection, Link};
use crate::task_host_protocol::{
    DetectedVersions, FromHost, HostedTask, TaskExit, TaskSettings, TaskSignal, ToHost, KILL_GRACE,
};
use airflow::backoff::Backoff;
use airflow::edge_types::EdgeJob;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

/// How long a start waits for a task host that is reconnecting.
const START_WAIT: Duration = Duration::from_secs(60);
/// How long a child task host gets to exit after its connection closed.
const CHILD_EXIT_WAIT: Duration = KILL_GRACE.saturating_add(Duration::from_secs(5));

type Started = Result<(i32, LaunchMode), String>;

pub struct TaskHost {
    settings: TaskSettings,
    state: Mutex<State>,
    connected: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    outbox: Option<mpsc::UnboundedSender<ToHost>>,
    starting: HashMap<String, oneshot::Sender<Started>>,
    running: HashMap<String, oneshot::Sender<TaskExit>>,
}

/// What the first welcome said.
pub struct Welcome {
    pub versions: DetectedVersions,
    /// Tasks a previous agent started, still running or ended and not reported.
    pub left_behind: Vec<LeftBehind>,
}

/// A task a previous agent started, as the task host keeps it, and this agent's hold on it:
/// followed from the welcome on, so that no exit is missed while the agent registers or waits
/// for a slot.
pub struct LeftBehind {
    pub task: HostedTask,
    pub remote: RemoteTask,
}

impl TaskHost {
    /// Reaches the task host and keeps the link up in the background until `stop`. Waits for
    /// the first welcome; a child task host that cannot be started is an error.
    pub async fn start(
        settings: TaskSettings,
        link: Link,
        stop: CancellationToken,
    ) -> anyhow::Result<(Arc<TaskHost>, Welcome, mpsc::UnboundedReceiver<LeftBehind>)> {
        let host = Arc::new(TaskHost {
            settings,
            state: Mutex::new(State::default()),
            connected: watch::channel(false).0,
        });
        let (first_tx, first_rx) = oneshot::channel();
        let (adopt_tx, adopt_rx) = mpsc::unbounded_channel();
        tokio::spawn(host.clone().maintain(link, stop, first_tx, adopt_tx));
        let welcome = first_rx
            .await
            .map_err(|_| anyhow::anyhow!("stopped before the task host answered"))??;
        Ok((host, welcome, adopt_rx))
    }

    async fn maintain(
        self: Arc<Self>,
        link: Link,
        stop: CancellationToken,
        first: oneshot::Sender<anyhow::Result<Welcome>>,
        adopt: mpsc::UnboundedSender<LeftBehind>,
    ) {
        let mut first = Some(first);
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            let connected = tokio::select! {
                connected = link.connect(&self.settings) => connected,
                _ = stop.cancelled() => return,
            };
            let connection = match connected {
                Ok(connection) => connection,
                Err(e) => {
                    if matches!(link, Link::Child { .. }) {
                        if let Some(first) = first.take() {
                            let _ =
                                first.send(Err(anyhow::anyhow!("cannot start the task host: {e}")));
                            return;
                        }
                    }
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot reach {}", link.describe());
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => continue,
                        _ = stop.cancelled() => return,
                    }
                }
            };
            backoff.reset();
            let Connection {
                mut events,
                mut requests,
                versions,
                tasks,
                child,
            } = connection;
            let (left_behind, ended) = self.reconcile(tasks);
            match first.take() {
                Some(first) => {
                    let _ = first.send(Ok(Welcome {
                        versions,
                        left_behind,
                    }));
                }
                None => {
                    tracing::info!("reconnected to the task host");
                    for task in left_behind {
                        let _ = adopt.send(task);
                    }
                }
            }
            let (outbox, mut pending) = mpsc::unbounded_channel();
            self.state.lock().unwrap().outbox = Some(outbox);
            // Their exits are known now: the task host may forget them.
            for id in ended {
                self.send(ToHost::Release { id });
            }
            self.connected.send_replace(true);
            let ended = loop {
                tokio::select! {
                    event = frames::receive::<FromHost, _>(&mut events) => match event {
                        Ok(event) => self.dispatch(event),
                        Err(e) => break e.to_string(),
                    },
                    Some(request) = pending.recv() => {
                        if let Err(e) = frames::send(&mut requests, &request).await {
                            break e.to_string();
                        }
                    }
                    _ = stop.cancelled() => break String::new(),
                }
            };
            self.state.lock().unwrap().outbox = None;
            self.connected.send_replace(false);
            drop((events, requests));
            if let Some(mut child) = child {
                let status = match tokio::time::timeout(CHILD_EXIT_WAIT, child.wait()).await {
                    Ok(Ok(status)) => status.to_string(),
                    _ => {
                        let _ = child.start_kill();
                        "killed: it did not exit".to_string()
                    }
                };
                if !stop.is_cancelled() {
                    tracing::error!(%status, "the task host exited; starting another");
                }
                self.lose_all(&format!(
                    "the task host (started by the agent) exited ({status})"
                ));
            } else if !stop.is_cancelled() {
                tracing::warn!(error = %ended, "lost the connection to the task host; reconnecting");
            }
            if stop.is_cancelled() {
                return;
            }
        }
    }

    /// Brings what the agent waits for in line with what the task host reports; returns the
    /// tasks it reports that this agent never started, followed from now on, and the ids of
    /// those among them that have ended.
    fn reconcile(self: &Arc<Self>, tasks: Vec<HostedTask>) -> (Vec<LeftBehind>, Vec<String>) {
        let mut state = self.state.lock().unwrap();
        let listed: HashMap<String, HostedTask> =
            tasks.into_iter().map(|t| (t.id.clone(), t)).collect();
        let mut unknown = Vec::new();
        let mut ended = Vec::new();
        for (id, task) in &listed {
            if let Some(started) = state.starting.remove(id) {
                let _ = started.send(Ok((task.pid, task.mode)));
            }
            if !state.running.contains_key(id) {
                let (exit_tx, exit_rx) = oneshot::channel();
                match &task.exit {
                    Some(exit) => {
                        let _ = exit_tx.send(exit.clone());
                        ended.push(id.clone());
                    }
                    None => {
                        state.running.insert(id.clone(), exit_tx);
                    }
                }
                let remote = RemoteTask {
                    id: id.clone(),
                    pid: task.pid,
                    mode: task.mode,
                    host: self.clone(),
                    exit: exit_rx,
                };
                unknown.push(LeftBehind {
                    task: task.clone(),
                    remote,
                });
            } else if let Some(exit) = &task.exit {
                if let Some(waiter) = state.running.remove(id) {
                    let _ = waiter.send(exit.clone());
                }
            }
        }
        let gone = "the task host no longer knows this task: it restarted, and the task's process ended with it";
        for (_, started) in state
            .starting
            .drain()
            .filter(|(id, _)| !listed.contains_key(id))
            .collect::<Vec<_>>()
        {
            let _ = started.send(Err(gone.to_string()));
        }
        let lost: Vec<String> = state
            .running
            .keys()
            .filter(|id| !listed.contains_key(*id))
            .cloned()
            .collect();
        for id in lost {
            if let Some(waiter) = state.running.remove(&id) {
                let _ = waiter.send(lost_exit(gone));
            }
        }
        (unknown, ended)
    }

    /// Every task the agent waits for ended with the task host.
    fn lose_all(&self, reason: &str) {
        let mut state = self.state.lock().unwrap();
        for (_, started) in state.starting.drain() {
            let _ = started.send(Err(reason.to_string()));
        }
        for (_, waiter) in state.running.drain() {
            let _ = waiter.send(lost_exit(reason));
        }
    }

    fn dispatch(&self, event: FromHost) {
        let mut state = self.state.lock().unwrap();
        match event {
            FromHost::Started { id, pid, mode } => {
                if let Some(started) = state.starting.remove(&id) {
                    let _ = started.send(Ok((pid, mode)));
                }
            }
            FromHost::StartFailed { id, error } => {
                state.running.remove(&id);
                if let Some(started) = state.starting.remove(&id) {
                    let _ = started.send(Err(error));
                }
            }
            FromHost::Exited { id, exit } => {
                if let Some(waiter) = state.running.remove(&id) {
                    let _ = waiter.send(exit);
                }
                if let Some(outbox) = &state.outbox {
                    let _ = outbox.send(ToHost::Release { id });
                }
            }
            other => tracing::warn!(
                message = other.kind(),
                "the task host said something out of turn; ignored"
            ),
        }
    }

    fn send(&self, request: ToHost) -> bool {
        let state = self.state.lock().unwrap();
        state
            .outbox
            .as_ref()
            .is_some_and(|o| o.send(request).is_ok())
    }

    /// Starts `job`'s task; its pid, or why not.
    pub async fn start_task(self: &Arc<Self>, job: &EdgeJob) -> Result<RemoteTask, String> {
        let mut connected = self.connected.subscribe();
        if tokio::time::timeout(START_WAIT, connected.wait_for(|c| *c))
            .await
            .is_err()
        {
            return Err(format!(
                "the task host has not been reachable for {START_WAIT:?}"
            ));
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (started_tx, started_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        {
            let mut state = self.state.lock().unwrap();
            state.starting.insert(id.clone(), started_tx);
            state.running.insert(id.clone(), exit_tx);
        }
        let request = ToHost::Start {
            id: id.clone(),
            job: serde_json::to_value(job).map_err(|e| e.to_string())?,
            workload: job.command.clone(),
        };
        if !self.send(request) {
            let mut state = self.state.lock().unwrap();
            state.starting.remove(&id);
            state.running.remove(&id);
            return Err("the connection to the task host broke".to_string());
        }
        let (pid, mode) = started_rx
            .await
            .map_err(|_| "the task host did not answer".to_string())??;
        Ok(RemoteTask {
            id,
            pid,
            mode,
            host: self.clone(),
            exit: exit_rx,
        })
    }

    fn signal(&self, id: &str, signal: TaskSignal) {
        if !self.send(ToHost::Signal {
            id: id.to_string(),
            signal,
        }) {
            tracing::warn!(task = %id, ?signal, "not connected to the task host: the signal is not sent");
        }
    }
}

fn lost_exit(reason: &str) -> TaskExit {
    TaskExit {
        code: None,
        signal: None,
        output_tail: reason.to_string(),
    }
}

/// How a task ended, as the agent sees it.
#[derive(Debug)]
pub enum Exit {
    /// It ended by itself.
    Finished(TaskExit),
    /// The agent stopped it (second signal or drain deadline).
    Killed(TaskExit),
}

/// A task running in the task host.
pub struct RemoteTask {
    id: String,
    pid: i32,
    mode: LaunchMode,
    host: Arc<TaskHost>,
    exit: oneshot::Receiver<TaskExit>,
}

impl RemoteTask {
    /// The supervisor's pid, in the task host's PID namespace.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn launched_by(&self) -> LaunchMode {
        self.mode
    }

    async fn exited(&mut self) -> TaskExit {
        (&mut self.exit)
            .await
            .unwrap_or_else(|_| lost_exit("the agent lost track of the task"))
    }

    /// Waits for the task to end; when `kill` fires first, SIGTERMs its process group
    /// (Airflow's supervisor then marks the task failed, so it can be retried), and SIGKILLs
    /// it after [`KILL_GRACE`].
    pub async fn wait(&mut self, kill: &CancellationToken) -> Exit {
        tokio::select! {
            exit = self.exited() => return Exit::Finished(exit),
            _ = kill.cancelled() => {}
        }
        self.host.signal(&self.id, TaskSignal::Term);
        match tokio::time::timeout(KILL_GRACE, self.exited()).await {
            Ok(exit) => Exit::Killed(exit),
            Err(_) => {
                self.host.signal(&self.id, TaskSignal::Kill);
                Exit::Killed(self.exited().await)
            }
        }
    }
}
