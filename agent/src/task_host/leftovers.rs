//! Processes a task leaves behind end with it.
//!
//! A task may double-fork a daemon into a session of its own: it outlives the task, and on a
//! shared worker it outlives every later task too, with the task host's user and network
//! namespace (the socket squatter of the hostile suite was one). The task host is PID 1 of the
//! tasks container (or a child subreaper), so every such orphan becomes its child. Once a
//! second it looks at its children: one it did not start or take over (the launcher, a task's
//! supervisor) for [`LEFTOVER_AFTER`] is a leftover. A leftover ends once every task that ran
//! when it was first seen has ended: SIGTERM, then SIGKILL after [`LEFTOVER_GRACE`]. Which of those tasks left it
//! cannot be told apart (a daemon changes its session, group and title at will), so a
//! leftover lives at most as long as the tasks it shared the worker with at birth.

use super::host::Host;
use super::reaper::{ProcessId, Reaper};
use nix::sys::signal::Signal;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How often the task host looks for leftovers.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How long a child goes unwatched before it counts as a leftover: the launcher's new
/// supervisor becomes the task host's child before the task host hears its pid and watches
/// it, milliseconds apart, seconds on a node that is very busy.
const LEFTOVER_AFTER: Duration = Duration::from_secs(10);
/// Between a leftover's SIGTERM and its SIGKILL.
const LEFTOVER_GRACE: Duration = Duration::from_secs(5);

/// Looks for leftovers every [`SWEEP_EVERY`] and ends them; never ends (dropped when the task
/// host stops).
pub async fn sweep(host: &Host) -> std::convert::Infallible {
    let mut leftovers = Leftovers::default();
    let mut every = tokio::time::interval(SWEEP_EVERY);
    loop {
        every.tick().await;
        leftovers.sweep(host);
    }
}

#[derive(Default)]
struct Leftovers {
    seen: HashMap<ProcessId, Sighting>,
}

struct Sighting {
    first_seen: Instant,
    /// The tasks running when it was first seen.
    witnesses: HashSet<String>,
    terminated_at: Option<Instant>,
}

impl Leftovers {
    fn sweep(&mut self, host: &Host) {
        let reaper = Reaper::global();
        let children = reaper.unwatched_children();
        self.seen.retain(|process, _| children.contains(process));
        let running = host.running_ids();
        for process in children {
            let sighting = self.seen.entry(process).or_insert_with(|| Sighting {
                first_seen: Instant::now(),
                witnesses: running.clone(),
                terminated_at: None,
            });
            if sighting.first_seen.elapsed() < LEFTOVER_AFTER
                || !sighting.witnesses.is_disjoint(&running)
            {
                continue;
            }
            match sighting.terminated_at {
                None => {
                    if reaper.signal_unwatched_child(process, Signal::SIGTERM) {
                        tracing::warn!(
                            pid = process.pid,
                            "ending a process a task left behind (SIGTERM): the tasks it \
                             shared the worker with have ended"
                        );
                    }
                    sighting.terminated_at = Some(Instant::now());
                }
                Some(at) if at.elapsed() >= LEFTOVER_GRACE => {
                    if reaper.signal_unwatched_child(process, Signal::SIGKILL) {
                        tracing::warn!(pid = process.pid, "killed a process a task left behind");
                    }
                }
                Some(_) => {}
            }
        }
    }
}
