//! How the launcher script (`agent/python/astro_launcher.py`) is run: its source in argv
//! (`python -c SOURCE astro-launcher ARG`), never from a file.
//!
//! Tasks run as the task host's user. A script on disk could be rewritten by one of them, or
//! shadowed by a module dropped beside it (Python puts a script's folder first on `sys.path`),
//! and it is run again whenever the launcher restarts — which a task can cause by killing it —
//! and for every task in fresh mode: every later workload, Execution API token included, would
//! pass through the task's code. argv is fixed at exec, and the script takes the current folder
//! (`-c` puts it first on `sys.path`) off the path before its first import.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// The launcher's source, carried in the binary.
pub(super) const SOURCE: &str = include_str!("../../python/astro_launcher.py");
/// The first argument after the source: it names the process in `ps` and `/proc/<pid>/cmdline`.
const NAME: &str = "astro-launcher";

/// `python -c SOURCE astro-launcher <arg>`.
pub(super) fn command(python: &Path, arg: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(python);
    command.arg("-c").arg(SOURCE).arg(NAME).arg(arg);
    command
}
