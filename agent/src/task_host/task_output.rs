//! A task's link to the task host: one end of a Unix socket pair that its supervisor's stdout
//! and stderr are, and over which a task the launcher forked claims its job first.
//!
//! Not a file: tasks run as the task host's user, and a named file in a folder is one another
//! task can open before its name goes (and read what the supervisor prints; Airflow 3.0's
//! prints the workload, token included), or pre-empt with a file of its own. An unnamed file or
//! a pipe can still be opened again through `/proc/<pid>/fd` of a process that is not yet
//! undumpable (a fresh interpreter, for its first milliseconds); a socket cannot. The task host
//! keeps the last [`KEPT`] bytes of what arrives, for the task's report.
//!
//! The claim: a launcher's task writes its pid (4 bytes, big-endian) and waits for one byte
//! before it runs. The task host answers only to the task it adopts; a task whose link closes
//! unanswered exits without running. So no job runs twice when the launcher fails half-way (its
//! task may exist or not) and the task host starts the job in a fresh interpreter instead.

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;
use tokio::net::UnixStream;

/// How much of a supervisor's output is kept: the end of it, for the report of its exit.
const KEPT: usize = 64 * 1024;
/// What a claimed task waits for before it runs.
const GO: &[u8] = b"!";

pub struct TaskOutput {
    stream: UnixStream,
    tail: VecDeque<u8>,
    /// The task's end and every copy of it are closed: nothing more will come.
    closed: bool,
}

impl TaskOutput {
    /// The task host's end, and the task's end to hand to the process that runs the task.
    pub fn pair() -> std::io::Result<(TaskOutput, OwnedFd)> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let output = TaskOutput {
            stream: UnixStream::from_std(ours)?,
            tail: VecDeque::new(),
            closed: false,
        };
        Ok((output, OwnedFd::from(theirs)))
    }

    /// The pid a launcher's task claims its job with, once it has sent it within `limit`.
    pub async fn claim(&mut self, limit: Duration) -> Option<i32> {
        let mut pid = [0u8; 4];
        let mut read = 0;
        let receiving = async {
            while read < pid.len() {
                self.stream.readable().await.ok()?;
                match self.stream.try_read(&mut pid[read..]) {
                    Ok(0) => return None,
                    Ok(n) => read += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => return None,
                }
            }
            Some(i32::from_be_bytes(pid))
        };
        tokio::time::timeout(limit, receiving).await.ok().flatten()
    }

    /// The pid a launcher's task has claimed its job with already, if one has: looked at once,
    /// without waiting.
    pub fn claimed_now(&mut self) -> Option<i32> {
        let mut pid = [0u8; 4];
        match recv(self.stream.as_raw_fd(), &mut pid, MsgFlags::MSG_DONTWAIT) {
            Ok(4) => Some(i32::from_be_bytes(pid)),
            _ => None,
        }
    }

    /// Lets the claimed task run.
    pub async fn go(&mut self) -> std::io::Result<()> {
        loop {
            self.stream.writable().await?;
            match self.stream.try_write(GO) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads what has arrived; returns once something did, or at once when the task's end is
    /// closed (then never again).
    pub async fn read_some(&mut self) {
        if self.closed {
            return std::future::pending().await;
        }
        let mut chunk = [0u8; 8192];
        loop {
            if self.stream.readable().await.is_err() {
                self.closed = true;
                return;
            }
            match self.stream.try_read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(n) => {
                    self.keep(&chunk[..n]);
                    return;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }

    /// Reads everything that has arrived so far, without waiting for more: at the task's
    /// exit, what it wrote before is all there, whether or not the runtime has seen it yet.
    pub fn read_arrived(&mut self) {
        let mut chunk = [0u8; 8192];
        while !self.closed {
            match recv(self.stream.as_raw_fd(), &mut chunk, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => self.closed = true,
                Ok(n) => self.keep(&chunk[..n]),
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => {}
                Err(_) => self.closed = true,
            }
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        self.tail.extend(bytes);
        let excess = self.tail.len().saturating_sub(KEPT);
        self.tail.drain(..excess);
    }

    /// The last `max` bytes kept.
    pub fn tail(&self, max: usize) -> String {
        let start = self.tail.len().saturating_sub(max);
        let bytes: Vec<u8> = self.tail.range(start..).copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream as TaskEnd;

    #[tokio::test]
    async fn a_claim_is_read_and_answered() {
        let (mut output, theirs) = TaskOutput::pair().unwrap();
        let mut task = TaskEnd::from(theirs);
        assert_eq!(output.claimed_now(), None, "nothing sent yet");
        task.write_all(&42i32.to_be_bytes()).unwrap();
        assert_eq!(output.claim(Duration::from_secs(5)).await, Some(42));
        output.go().await.unwrap();
        let mut go = [0u8; 1];
        task.read_exact(&mut go).unwrap();
        assert_eq!(&go, GO);

        // A claim sent already is seen at once (the launcher failed after its task claimed).
        let (mut output, theirs) = TaskOutput::pair().unwrap();
        TaskEnd::from(theirs)
            .write_all(&7i32.to_be_bytes())
            .unwrap();
        assert_eq!(output.claimed_now(), Some(7));

        // A task gone before it claimed: no claim, no wait for the limit.
        let (mut output, theirs) = TaskOutput::pair().unwrap();
        drop(theirs);
        assert_eq!(output.claim(Duration::from_secs(60)).await, None);
    }

    #[tokio::test]
    async fn the_last_bytes_are_kept_however_much_arrives() {
        let (mut output, theirs) = TaskOutput::pair().unwrap();
        let writer = std::thread::spawn(move || {
            let mut task = TaskEnd::from(theirs);
            task.write_all(&vec![b'x'; 3 * KEPT]).unwrap();
            task.write_all(b"end").unwrap();
        });
        while !output.closed {
            output.read_some().await;
        }
        writer.join().unwrap();
        let tail = output.tail(usize::MAX);
        assert_eq!(tail.len(), KEPT);
        assert!(tail.ends_with("xend"), "{:?}", &tail[tail.len() - 10..]);
        assert_eq!(output.tail(4), "xend");
    }
}
