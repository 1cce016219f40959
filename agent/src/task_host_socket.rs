//! The task host's socket in a worker Pod: a name in the abstract namespace of the Pod's network
//! namespace (`@name`), never a file.
//!
//! A socket file sits in a folder the tasks can write (the volume both containers mount, the
//! tasks running as the task host's user): a task could unlink it and bind its own, and the
//! next agent to connect — after any restart of the agent container — would hand that task
//! every later workload, Execution API token included. An abstract name has no file to replace:
//! the task host binds it before it starts any task, and the kernel frees it only when the task
//! host's listening socket closes, which ends the tasks container and every task with it. Both
//! containers of a Pod share its network namespace, so the agent reaches the name; nothing
//! outside the Pod does.

use std::fmt;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::str::FromStr;

/// The longest abstract name: `sun_path` (108 bytes) less the leading NUL.
const MAX_NAME: usize = 107;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskHostSocket {
    name: String,
}

impl FromStr for TaskHostSocket {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        let Some(name) = value.strip_prefix('@') else {
            return Err(format!(
                "{value:?} is not an abstract socket name (@NAME, e.g. @astro-agent/task-host): \
                 a socket file in a folder tasks can write can be replaced by a task"
            ));
        };
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(format!(
                "{value:?}: the name after @ must have 1 to {MAX_NAME} bytes"
            ));
        }
        Ok(TaskHostSocket {
            name: name.to_string(),
        })
    }
}

impl fmt::Display for TaskHostSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "@{}", self.name)
    }
}

impl TaskHostSocket {
    fn address(&self) -> io::Result<SocketAddr> {
        SocketAddr::from_abstract_name(self.name.as_bytes())
    }

    /// Listens on the name. Fails with `AddrInUse` while another process holds it.
    pub fn bind(&self) -> io::Result<tokio::net::UnixListener> {
        let listener = std::os::unix::net::UnixListener::bind_addr(&self.address()?)?;
        listener.set_nonblocking(true)?;
        tokio::net::UnixListener::from_std(listener)
    }

    pub async fn connect(&self) -> io::Result<tokio::net::UnixStream> {
        let address = self.address()?;
        // A Unix connect completes at once unless the listener's backlog is full: off the
        // runtime's threads for that case.
        let stream = tokio::task::spawn_blocking(move || {
            std::os::unix::net::UnixStream::connect_addr(&address)
        })
        .await
        .map_err(io::Error::other)??;
        stream.set_nonblocking(true)?;
        tokio::net::UnixStream::from_std(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique() -> TaskHostSocket {
        format!("@astro-agent-test/{}", uuid::Uuid::new_v4())
            .parse()
            .unwrap()
    }

    #[test]
    fn a_path_is_refused_with_the_reason() {
        let error = "/run/astro-agent/task-host.sock"
            .parse::<TaskHostSocket>()
            .unwrap_err();
        assert!(error.contains("not an abstract socket name"), "{error}");
        assert!(error.contains("replaced by a task"), "{error}");
    }

    #[test]
    fn names_are_bounded() {
        assert!("@".parse::<TaskHostSocket>().is_err());
        assert!(format!("@{}", "x".repeat(MAX_NAME))
            .parse::<TaskHostSocket>()
            .is_ok());
        assert!(format!("@{}", "x".repeat(MAX_NAME + 1))
            .parse::<TaskHostSocket>()
            .is_err());
        assert_eq!(
            "@astro-agent/task-host"
                .parse::<TaskHostSocket>()
                .unwrap()
                .to_string(),
            "@astro-agent/task-host"
        );
    }

    #[tokio::test]
    async fn a_held_name_cannot_be_bound_again_and_connects_to_its_holder() {
        let socket = unique();
        let listener = socket.bind().unwrap();
        // What a task that wants the agent's connections would try: it is refused.
        let squat = socket.bind().unwrap_err();
        assert_eq!(squat.kind(), io::ErrorKind::AddrInUse);
        let (_client, accepted) = tokio::join!(socket.connect(), listener.accept());
        accepted.unwrap();
    }

    #[tokio::test]
    async fn the_name_is_free_again_once_its_holder_closed_it() {
        let socket = unique();
        drop(socket.bind().unwrap());
        assert_eq!(
            socket.connect().await.unwrap_err().kind(),
            io::ErrorKind::ConnectionRefused
        );
        socket.bind().unwrap();
    }
}
