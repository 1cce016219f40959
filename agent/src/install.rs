//! `astro-agent install DIR`: copies this binary into DIR, for a worker Pod's init container
//! (the agent's image has no shell and no `cp`; the binary is the one thing to install).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;

pub fn main(mut args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("astro-agent install: usage: astro-agent install DIR");
        return ExitCode::from(logging::flags::EXIT_CONFIG);
    };
    match install(Path::new(&dir)) {
        Ok(path) => {
            eprintln!("astro-agent install: copied to {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("astro-agent install: {}: {e}", Path::new(&dir).display());
            ExitCode::FAILURE
        }
    }
}

/// Copies under a temporary name, then renames: a container that starts from DIR never sees
/// half a binary.
fn install(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    let source = std::env::current_exe()?;
    std::fs::create_dir_all(dir)?;
    let target = dir.join("astro-agent");
    let partial = dir.join(".astro-agent.partial");
    std::fs::copy(&source, &partial)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, &target)?;
    Ok(target)
}
