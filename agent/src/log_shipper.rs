//! Ships a task's log file to Airflow while the task runs, and once more at the end.
//!
//! The task writes its log under the log folder at the workload's `log_path`. The shipper
//! reads what is new since the last push and sends it in chunks of at most 512 KiB (the Edge
//! API's limit). Text that could not be sent stays queued for the next push, so an Airflow
//! outage delays logs but loses none.

use crate::task_log_file::TaskLogFile;
use airflow::edge_client::EdgeClient;
use airflow::edge_types::TaskKey;
use airflow::ApiError;
use std::io::{Read, Seek, SeekFrom};

/// Largest chunk the Edge API accepts in one push.
pub const MAX_CHUNK_BYTES: usize = 512 * 1024;
/// Read at most this much of the file per push, so one huge burst cannot hold a task's memory.
const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;

pub struct LogShipper {
    file: Option<TaskLogFile>,
    /// Whether the agent's log already says why the file cannot be read.
    refusal_logged: bool,
    offset: u64,
    /// Bytes of an incomplete UTF-8 sequence at the end of the last read.
    partial: Vec<u8>,
    /// Text read but not yet accepted by Airflow.
    unsent: String,
}

impl LogShipper {
    /// `file` is `None` when the workload names no log file (nothing to tail).
    pub fn new(file: Option<TaskLogFile>) -> Self {
        LogShipper {
            file,
            refusal_logged: false,
            offset: 0,
            partial: Vec::new(),
            unsent: String::new(),
        }
    }

    /// Reads what the task added since the last call and pushes it with everything still
    /// unsent. Stops at the first failed push; the rest waits for the next call.
    pub async fn ship(&mut self, edge: &EdgeClient, key: &TaskKey) -> Result<(), ApiError> {
        self.read_new();
        while !self.unsent.is_empty() {
            let end = chunk_end(&self.unsent, MAX_CHUNK_BYTES);
            edge.push_logs(key, &self.unsent[..end]).await?;
            self.unsent.drain(..end);
        }
        Ok(())
    }

    /// Adds a note of the agent's own (for example why a task could not start) to the log.
    pub fn append_note(&mut self, note: &str) {
        self.read_new();
        if !self.unsent.is_empty() && !self.unsent.ends_with('\n') {
            self.unsent.push('\n');
        }
        self.unsent.push_str(note);
        if !note.ends_with('\n') {
            self.unsent.push('\n');
        }
    }

    fn read_new(&mut self) {
        let Some(log) = &self.file else { return };
        let mut file = match log.open() {
            Ok(file) => file,
            // Not created yet, or removed by log rotation: try again next time.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                if !std::mem::replace(&mut self.refusal_logged, true) {
                    tracing::warn!(log = %log.path().display(), error = %e, "not shipping a task log that is a link, a FIFO or beneath a link (something in the log folder put it there)");
                }
                return;
            }
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return;
        };
        if len < self.offset {
            // Truncated under us: start over rather than miss the new content.
            self.offset = 0;
        }
        if len == self.offset || file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut bytes = std::mem::take(&mut self.partial);
        let before = bytes.len();
        if file.take(MAX_READ_BYTES).read_to_end(&mut bytes).is_err() {
            self.partial = bytes;
            return;
        }
        self.offset += (bytes.len() - before) as u64;
        let valid = match std::str::from_utf8(&bytes) {
            Ok(_) => bytes.len(),
            // An incomplete sequence at the very end is kept for the next read; anything
            // else invalid is replaced below.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => bytes.len(),
        };
        self.partial = bytes.split_off(valid);
        // NUL bytes are refused by the database behind the log table.
        let text = String::from_utf8_lossy(&bytes).replace('\0', "\u{FFFD}");
        self.unsent.push_str(&text);
    }
}

/// The end of the next chunk: at most `max` bytes, on a char boundary, preferably just after
/// a newline so that log lines stay whole.
fn chunk_end(text: &str, max: usize) -> usize {
    if text.len() <= max {
        return text.len();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match text[..end].rfind('\n') {
        Some(nl) if nl > 0 => nl + 1,
        _ => end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::Path;

    #[test]
    fn chunks_respect_the_limit_lines_and_chars() {
        assert_eq!(chunk_end("short", 10), 5);
        assert_eq!(chunk_end("line one\nline two\n", 12), 9);
        // No newline: cut at the limit, but never inside a character.
        let s = "ééééé"; // 2 bytes each
        assert_eq!(chunk_end(s, 5), 4);
    }

    #[test]
    fn reads_only_new_bytes_and_keeps_split_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task.log");
        let mut shipper =
            LogShipper::new(Some(TaskLogFile::new(dir.path(), Path::new("task.log"))));
        shipper.read_new(); // file does not exist yet
        assert!(shipper.unsent.is_empty());

        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"first\n\xc3").unwrap(); // first byte of 'é'
        f.flush().unwrap();
        shipper.read_new();
        assert_eq!(shipper.unsent, "first\n");
        f.write_all(b"\xa9\0x\n").unwrap();
        f.flush().unwrap();
        shipper.read_new();
        assert_eq!(shipper.unsent, "first\né\u{FFFD}x\n");
        shipper.read_new();
        assert_eq!(
            shipper.unsent, "first\né\u{FFFD}x\n",
            "nothing new, nothing added"
        );
    }

    /// A task plants a link where another task's log folder will be, pointing at the agent's
    /// secrets: the agent ships nothing of what the link leads to.
    #[test]
    fn a_log_beneath_a_planted_link_ships_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (logs, secrets) = (dir.path().join("logs"), dir.path().join("secrets"));
        std::fs::create_dir_all(secrets.join("run_id=r")).unwrap();
        std::fs::write(secrets.join("run_id=r/attempt=1.log"), "jwt-secret").unwrap();
        std::fs::create_dir_all(&logs).unwrap();
        std::os::unix::fs::symlink(&secrets, logs.join("dag_id=victim")).unwrap();
        let log = TaskLogFile::new(&logs, Path::new("dag_id=victim/run_id=r/attempt=1.log"));
        let mut shipper = LogShipper::new(Some(log));
        shipper.read_new();
        assert_eq!(shipper.unsent, "", "shipped what the link leads to");
    }

    #[test]
    fn notes_are_appended_on_their_own_line() {
        let mut shipper = LogShipper::new(None);
        shipper.append_note("could not start: no python");
        assert_eq!(shipper.unsent, "could not start: no python\n");
    }
}
