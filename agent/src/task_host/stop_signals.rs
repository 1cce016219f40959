//! Which SIGTERM and SIGINT stop the task host: only those its tasks cannot have sent.
//!
//! In a worker Pod the task host is PID 1 of the tasks container, and every task runs as its
//! user in its PID namespace: `kill -TERM 1` from one task would stop every task of the worker.
//! The kubelet's stop comes from outside the namespace, where the kernel shows the sender as
//! pid 0; where the agent starts the task host as a child, the agent is its parent. A stop
//! signal from any other process -- one of the tasks, or something they left behind -- is
//! logged and ignored.

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::exfiltrator::origin::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::Origin;
use tokio::sync::oneshot;

/// Completes with the name of the first stop signal the task host obeys. Signals are read on a
/// thread of their own (a signal handler can only note them).
pub fn obeyed_stop() -> std::io::Result<oneshot::Receiver<&'static str>> {
    let mut signals = SignalsInfo::<WithOrigin>::new([SIGTERM, SIGINT])?;
    let (stop, stopped) = oneshot::channel();
    std::thread::Builder::new()
        .name("stop-signals".into())
        .spawn(move || {
            for origin in signals.forever() {
                let name = if origin.signal == SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                };
                match sender(&origin) {
                    Sender::Outside => {
                        let _ = stop.send(name);
                        return;
                    }
                    Sender::Inside(pid) => tracing::warn!(
                        sender = pid,
                        "ignored {name} from a process of this container (a task's, it may be): \
                         only the container's stop, or the agent that started this task host, \
                         stops it"
                    ),
                }
            }
        })?;
    Ok(stopped)
}

enum Sender {
    /// The kernel, a process outside this PID namespace, or this process's parent.
    Outside,
    /// Another process of this PID namespace.
    Inside(i32),
}

fn sender(origin: &Origin) -> Sender {
    match origin.process {
        None => Sender::Outside,
        Some(process) if process.pid == 0 => Sender::Outside,
        Some(process) if process.pid == std::os::unix::process::parent_id() as i32 => {
            Sender::Outside
        }
        Some(process) => Sender::Inside(process.pid),
    }
}
