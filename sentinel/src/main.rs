//! astro-sentinel: the backlog service KEDA asks. Exit codes: 0 clean stop on SIGTERM or
//! SIGINT, 2 invalid configuration (one line naming the field), 1 runtime error.
//! `astro-sentinel ensure-secrets` makes the Secrets its callers authenticate with
//! ([`astro_sentinel::secrets`]).

use astro_sentinel::app::{self, StartError};
use astro_sentinel::config::flags::{Flags, Settings};
use logging::flags::EXIT_CONFIG;
use std::process::ExitCode;

const EXIT_RUNTIME: u8 = 1;

fn main() -> ExitCode {
    // A subcommand before the Sentinel's flags, which stay top-level (`ASTRO_SENTINEL_*`).
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(std::ffi::OsStr::new("ensure-secrets")) {
        return astro_sentinel::secrets::main(args);
    }
    let flags: Flags = match logging::flags::parse() {
        Ok(flags) => flags,
        Err(exit) => return exit,
    };
    let settings = match Settings::from_flags(&flags) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("astro-sentinel: invalid configuration: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    logging::init(flags.log_format);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("astro-sentinel: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    runtime.block_on(async {
        // Install the handlers before anything can take long: a SIGTERM during start-up must
        // still be a clean stop.
        let mut signals = match astro_sentinel::shutdown::Signals::install() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("astro-sentinel: cannot install signal handlers: {e}");
                return ExitCode::from(EXIT_RUNTIME);
            }
        };
        let running = match app::start(settings).await {
            Ok(r) => r,
            Err(StartError::Config(e)) => {
                eprintln!("astro-sentinel: invalid configuration: {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
            Err(StartError::Runtime(e)) => {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::from(EXIT_RUNTIME);
            }
        };
        let name = signals.recv().await;
        tracing::info!(signal = name, "stopping");
        running.stop().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}
