//! astro-agent: runs Apache Airflow 3 tasks from the Edge Worker API, exports queue-depth
//! metrics for autoscaling, and drains on SIGTERM.

mod admin_server;
mod agent;
mod config;
mod context;
mod fetch_loop;
mod frames;
mod heartbeat;
mod install;
mod log_shipper;
mod metrics;
mod queue_stats;
mod registration;
mod reporter;
mod sentinel_subscription;
mod settings_drift;
mod shutdown;
mod slots;
mod sse;
mod stop_budget;
mod task_env;
mod task_host;
mod task_host_client;
mod task_host_link;
mod task_host_protocol;
mod task_host_socket;
mod task_log_file;
mod task_runner;
mod versions;
mod wake;
mod worker_status;
mod workload;

use clap::ValueEnum;
use logging::flags::EXIT_CONFIG;
use std::io::Write;
use std::process::ExitCode;

/// The one line a failed start leaves on stderr, written in a single call: `eprintln!` writes
/// its pieces one by one to the unbuffered stderr, and the task host (a child sharing that
/// stderr, stopping at the same moment) could slip a line of its own between them.
fn say_fatal(message: &str) {
    let _ = std::io::stderr().write_all(format!("astro-agent: {message}\n").as_bytes());
}

fn main() -> ExitCode {
    // Before any secret is read: a process that is not dumpable has its /proc/<pid>/environ,
    // mem, maps, fd and the like owned by root and closed to ptrace, so the tasks, which run
    // as the same user, cannot read the agent's environment or memory. (The tasks themselves
    // are dumpable again: exec resets the flag, and they inherit no secret.) The task host
    // too: it holds every task's workload until the task has it.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        say_fatal(&format!("cannot make the process non-dumpable: {e}"));
        return ExitCode::FAILURE;
    }
    // Subcommands before the agent's flags, which stay top-level (`ASTRO_AGENT_*`).
    let mut args = std::env::args_os().skip(1);
    match args.next().as_ref().and_then(|a| a.to_str()) {
        Some("task-host") => return task_host::main(args),
        Some("install") => return install::main(args),
        _ => {}
    }
    let flags: config::Flags = match logging::flags::parse() {
        Ok(flags) => flags,
        Err(exit) => return exit,
    };
    logging::init(flags.log_format);
    let log_format = flags
        .log_format
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();

    let hostname = || {
        std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| nix::unistd::gethostname().ok()?.into_string().ok())
    };
    let config = match flags.validate(std::env::var("ASTRO_AGENT_JWT_SECRET").ok(), hostname) {
        Ok(config) => config,
        Err(e) => {
            say_fatal(&e.to_string());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let task_env = task_env::inherited(std::env::vars_os(), &config.task_env_allow);
    // One thread is plenty: the agent only waits on sockets, pipes and child processes.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say_fatal(&format!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(agent::run(config, task_env, log_format)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<config::ConfigError>().is_some() => {
            say_fatal(&e.to_string());
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
