//! The messages between the agent and its task host (`astro-agent task-host`), framed as
//! [`crate::frames`] says, on a Unix socket: a socket pair when the agent starts the task host
//! itself, a socket in a volume both containers of a worker Pod mount otherwise.
//!
//! The agent says hello with the settings tasks run with; the task host answers with the
//! versions of Airflow it finds and how many tasks it runs (tasks a previous agent started,
//! still running or ended and not yet released), then one frame per such task: however many
//! there are, no frame outgrows [`crate::frames::MAX_MESSAGE`]. Then: start, signal, release
//! from the agent; started, start failed, exited from the task host. A task the agent has not released stays with the task
//! host, so an agent that restarts learns how its tasks ended.

use crate::config::LaunchMode;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// How long a task gets between SIGTERM and SIGKILL when it must be stopped.
pub const KILL_GRACE: Duration = Duration::from_secs(10);

/// Changes whenever a message changes incompatibly; both sides refuse another version.
pub const PROTOCOL: u32 = 2;

/// How tasks start and what they are told; the agent's flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSettings {
    /// The Python that has the Airflow task SDK (in the task host's container).
    pub python: PathBuf,
    pub execution_api_url: String,
    /// The task instance's host name in Airflow.
    pub worker_name: String,
    pub log_folder: PathBuf,
    pub mode: LaunchMode,
    /// Tasks that may run at once: the most spares the launcher keeps.
    pub slots: u32,
    /// Variables of the task host's environment tasks get besides the built-in allowlist
    /// (`NAME` or `PREFIX*`).
    pub task_env_allow: Vec<String>,
}

/// Agent → task host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToHost {
    /// First on every connection.
    Hello {
        protocol: u32,
        settings: TaskSettings,
    },
    /// Start a task. `job` is kept as given and handed back to a later agent; `workload` is
    /// Airflow's workload for the task's supervisor.
    Start {
        id: String,
        job: serde_json::Value,
        workload: serde_json::Value,
    },
    /// Signal the task's process group.
    Signal { id: String, signal: TaskSignal },
    /// The agent has the task's exit: the task host forgets the task.
    Release { id: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskSignal {
    Term,
    Kill,
}

/// Task host → agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromHost {
    /// The answer to hello; `tasks` [`FromHost::Hosted`] frames follow it.
    Welcome {
        protocol: u32,
        versions: DetectedVersions,
        tasks: u32,
    },
    /// One task the task host runs or ran, right after the welcome.
    Hosted {
        task: HostedTask,
    },
    Started {
        id: String,
        pid: i32,
        mode: LaunchMode,
    },
    StartFailed {
        id: String,
        error: String,
    },
    Exited {
        id: String,
        exit: TaskExit,
    },
    /// The task host cannot serve this agent (e.g. another protocol version); it closes the
    /// connection after this.
    Refused {
        reason: String,
    },
}

impl FromHost {
    /// What kind of message it is, to log: some carry a workload and its token.
    pub fn kind(&self) -> &'static str {
        match self {
            FromHost::Welcome { .. } => "welcome",
            FromHost::Hosted { .. } => "hosted",
            FromHost::Started { .. } => "started",
            FromHost::StartFailed { .. } => "start_failed",
            FromHost::Exited { .. } => "exited",
            FromHost::Refused { .. } => "refused",
        }
    }
}

/// A task the task host runs or ran, as a new agent learns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostedTask {
    pub id: String,
    pub job: serde_json::Value,
    pub pid: i32,
    pub mode: LaunchMode,
    /// Set when it has ended.
    pub exit: Option<TaskExit>,
}

/// How a task's supervisor process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskExit {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// The last bytes the supervisor printed (its own errors land there, not in the task log).
    pub output_tail: String,
}

impl TaskExit {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl std::fmt::Display for TaskExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit status: {code}"),
            (None, Some(signal)) => write!(f, "signal: {signal}"),
            (None, None) => f.write_str("an unknown status"),
        }
    }
}

/// The versions the task host's Python has installed, for the agent to report to Airflow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetectedVersions {
    pub airflow: Option<String>,
    pub edge_provider: Option<String>,
    /// Why detection failed, when it did.
    pub problem: Option<String>,
}
