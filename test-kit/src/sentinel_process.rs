//! The `astro-sentinel` binary as a process for a test: started on a free port, its log lines
//! kept (and searchable), its metrics read, stopped with SIGTERM.

use crate::child_guard::ChildGuard;
use crate::keda::keda_get;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct SentinelProcess {
    pub child: ChildGuard,
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl SentinelProcess {
    /// Starts `binary --config config --listen 127.0.0.1:0 extra...` with `env`, and waits for
    /// its "listening" line.
    pub fn start(binary: &Path, config: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(binary);
        command
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0", "--log-format", "text"])
            .args(extra);
        // Nothing from the caller's shell leaks in.
        for (k, _) in std::env::vars() {
            if k.starts_with("ASTRO_SENTINEL_") || k.starts_with("KUBERNETES_") {
                command.env_remove(k);
            }
        }
        let mut child = ChildGuard(
            command
                .envs(env.iter().copied())
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stderr = child.0.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening") {
                    if let Some(addr) = line.split("addr=").nth(1) {
                        let addr = addr.split_whitespace().next().unwrap_or_default();
                        let _ = addr_tx.send(addr.to_string());
                    }
                }
                lines.lock().unwrap().push(line);
            }
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no 'listening' line; got {:#?}", log.lock().unwrap()));
        SentinelProcess {
            child,
            addr: addr.parse().unwrap(),
            log,
        }
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The value of the metric line that starts with `series` (name and labels), if any.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = keda_get(self.addr, "/metrics", None).await.body;
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// SIGTERM, then its exit code.
    pub fn stop(&mut self) -> i32 {
        let pid = nix::unistd::Pid::from_raw(self.child.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.0.try_wait().unwrap().is_none()
    }
}
