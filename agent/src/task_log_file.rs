//! A task's log file, opened beneath the log folder in a way no task can redirect.
//!
//! The log folder is a volume the tasks write too, as the task host's user: a task may plant a
//! symbolic link anywhere in it (say `dag_id=other/run_id=…` → the agent's secrets folder,
//! which only the agent container mounts) or put a FIFO where a log will be. Following the link
//! would ship the file it points to into a task log anyone with access to that log can read; opening
//! the FIFO would block the agent. So the path is walked one component at a time from the log
//! folder, none may be a symbolic link (`O_NOFOLLOW` on each), the open never blocks
//! (`O_NONBLOCK`), and only a regular file is read.

use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::Mode;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone)]
pub struct TaskLogFile {
    folder: PathBuf,
    relative: PathBuf,
}

impl TaskLogFile {
    /// `relative` is the job's `log_path` (its own components only: no `..`, not absolute).
    pub fn new(folder: &Path, relative: &Path) -> Self {
        TaskLogFile {
            folder: folder.to_path_buf(),
            relative: relative.to_path_buf(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.folder.join(&self.relative)
    }

    pub fn open(&self) -> io::Result<File> {
        let names: Vec<&OsStr> = self
            .relative
            .components()
            .map(|c| match c {
                Component::Normal(name) => Ok(Some(name)),
                Component::CurDir => Ok(None),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a log path must stay beneath the log folder",
                )),
            })
            .filter_map(Result::transpose)
            .collect::<io::Result<_>>()?;
        let Some((file_name, folders)) = names.split_last() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty log path",
            ));
        };
        let directory = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        // The log folder itself is the agent's configuration: it may be reached through links.
        let mut folder = open(&self.folder, directory, Mode::empty())?;
        for name in folders {
            folder = openat(&folder, *name, directory | OFlag::O_NOFOLLOW, Mode::empty())?;
        }
        let file = File::from(openat(
            &folder,
            *file_name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?);
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    const LOG: &str = "dag_id=d/run_id=r/task_id=t/attempt=1.log";

    fn read(folder: &Path) -> io::Result<String> {
        let mut text = String::new();
        TaskLogFile::new(folder, Path::new(LOG))
            .open()?
            .read_to_string(&mut text)?;
        Ok(text)
    }

    /// A log folder and, beside it, a folder the tasks must not reach (the agent's secrets).
    fn folders() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        let secrets = dir.path().join("secrets");
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::create_dir_all(secrets.join("run_id=r/task_id=t")).unwrap();
        std::fs::write(
            secrets.join("run_id=r/task_id=t/attempt=1.log"),
            "jwt-secret",
        )
        .unwrap();
        (dir, logs, secrets)
    }

    #[test]
    fn a_regular_log_file_is_read() {
        let (_dir, logs, _) = folders();
        std::fs::create_dir_all(logs.join("dag_id=d/run_id=r/task_id=t")).unwrap();
        std::fs::write(logs.join(LOG), "task output").unwrap();
        assert_eq!(read(&logs).unwrap(), "task output");
    }

    #[test]
    fn a_link_planted_in_a_folder_of_the_path_is_not_followed() {
        let (_dir, logs, secrets) = folders();
        symlink(&secrets, logs.join("dag_id=d")).unwrap();
        let error = read(&logs).unwrap_err();
        assert_ne!(error.kind(), io::ErrorKind::NotFound, "{error}");
    }

    #[test]
    fn a_link_in_place_of_the_file_is_not_followed() {
        let (_dir, logs, secrets) = folders();
        std::fs::create_dir_all(logs.join("dag_id=d/run_id=r/task_id=t")).unwrap();
        symlink(
            secrets.join("run_id=r/task_id=t/attempt=1.log"),
            logs.join(LOG),
        )
        .unwrap();
        assert!(read(&logs).is_err());
    }

    #[test]
    fn a_fifo_in_place_of_the_file_is_refused_without_blocking() {
        let (_dir, logs, _) = folders();
        std::fs::create_dir_all(logs.join("dag_id=d/run_id=r/task_id=t")).unwrap();
        nix::unistd::mkfifo(&logs.join(LOG), Mode::S_IRWXU).unwrap();
        // A blocking open would wait here for a writer that never comes.
        let error = read(&logs).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
    }

    #[test]
    fn a_path_out_of_the_folder_is_refused() {
        let (_dir, logs, _) = folders();
        let file = TaskLogFile::new(&logs, Path::new("../secrets/x"));
        assert_eq!(file.open().unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
