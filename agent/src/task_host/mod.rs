//! `astro-agent task-host`: runs the tasks, apart from the agent and its credentials.
//!
//! In a worker Pod it is PID 1 of the tasks container (the user's own Airflow image, with this
//! binary copied in by an init container) and listens on an abstract Unix socket name in the
//! network namespace the agent container shares; elsewhere the agent starts it as a child on
//! a socket pair. Either way it speaks [`crate::task_host_protocol`]: it starts tasks (through
//! the pre-forked launcher, or fresh interpreters), signals them, reaps every process that ends
//! up its child, ends what tasks leave behind (`leftovers`), and reports each task's pid, exit
//! status and output tail. It holds no Airflow credential; it is not dumpable, so the tasks,
//! which run as the same user, cannot read its memory or environment, and it obeys no task's
//! stop signal (`stop_signals`). Tasks outlive the agent's connection: an agent that
//! reconnects learns what ran and how it ended.

mod flags;
mod host;
mod launcher_protocol;
mod launcher_script;
mod leftovers;
mod listener;
mod prefork_launcher;
mod reaper;
mod session;
mod stop_signals;
mod task_output;
mod task_process;
mod task_spawner;
mod token_redaction;
mod versions_probe;

use flags::{Connection, TaskHostFlags};
use host::Host;
use std::ffi::OsString;
use std::os::fd::FromRawFd;
use std::process::ExitCode;
use std::sync::Arc;

/// The task host's command line (`args` without the program and subcommand names).
pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let flags: TaskHostFlags = match logging::flags::parse_from(
        std::iter::once(OsString::from("task-host")).chain(args),
    ) {
        Ok(flags) => flags,
        Err(exit) => return exit,
    };
    logging::init(flags.log_format);
    // Becomes a child subreaper and starts the thread that waits for every child.
    reaper::Reaper::global();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("astro-agent task-host: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: TaskHostFlags) -> anyhow::Result<()> {
    let host = Host::new(std::env::vars_os().collect());
    let stop_signal = stop_signals::obeyed_stop()?;
    let serving = async {
        match flags.connection() {
            Connection::Socket(socket) => listener::serve(host.clone(), &socket).await,
            Connection::Inherited(fd) => {
                // SAFETY: the agent passed this descriptor (one end of a socket pair) and
                // nothing else in this process uses it.
                let stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
                stream.set_nonblocking(true)?;
                session::serve(host.clone(), tokio::net::UnixStream::from_std(stream)?).await;
                // The agent that started us is gone: nobody is left to report to.
                tracing::info!("the agent closed its connection: stopping");
                Ok(())
            }
        }
    };
    let outcome = tokio::select! {
        outcome = serving => outcome,
        never = leftovers::sweep(&host) => match never {},
        Ok(signal) = stop_signal => { tracing::info!("{signal}: stopping"); Ok(()) }
    };
    stop(&host).await;
    outcome
}

/// Stops every task still running (SIGTERM, SIGKILL after the grace) and the launcher.
async fn stop(host: &Arc<Host>) {
    let running = host.running();
    if running > 0 {
        tracing::warn!(running, "stopping the tasks still running");
    }
    host.stop_tasks.cancel();
    host.watchers.close();
    host.watchers.wait().await;
    host.stop_launcher();
}
