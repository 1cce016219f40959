//! The real `astro-agent` binary as a process, against a [`FakeAirflow`], with a fake task
//! supervisor in place of Airflow's.

use crate::fake_edge_api::{FakeAirflow, State, SECRET};
use crate::port::free_port;
use crate::raw_http::try_raw_request;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// A fake `python` that plays the launcher script's one-task mode and Airflow's supervisor:
/// it says it is ready on its stdin socket, reads its request there, takes `fake.sleep` and
/// `fake.exit` from the workload in it, writes the task log, and reports SIGTERM in it. With
/// `leave_behind` in the workload it first leaves a daemon behind (double-forked, a session of
/// its own, sleeping 300 s) whose pid it writes to `<leave_behind>.pid`. Each one also
/// leaves a file in `running/` while it runs and appends how many it saw there (itself
/// included) to `concurrency`: the largest number is the most task processes at once.
pub fn fake_python(dir: &Path) -> PathBuf {
    let path = dir.join("python");
    std::fs::write(
        &path,
        r#"#!/bin/sh
here="$(dirname "$0")"
f="$here/request.$$"
printf '!' >&0
tail -c +5 <&0 > "$f"
secs=$(sed -n 's/.*"sleep":\([0-9.]*\).*/\1/p' "$f")
code=$(sed -n 's/.*"exit":\([0-9]*\).*/\1/p' "$f")
daemon=$(sed -n 's/.*"leave_behind":"\([^"]*\)".*/\1/p' "$f")
[ -z "$daemon" ] || ( setsid sh -c 'echo $$ > "$1"; exec sleep 300' sh "$here/$daemon.pid" </dev/null >/dev/null 2>&1 & )
log="$AIRFLOW__LOGGING__BASE_LOG_FOLDER/$(sed -n 's/.*"log_path":"\([^"]*\)".*/\1/p' "$f")"
mkdir -p "$(dirname "$log")" "$here/running"
touch "$here/running/$$"
ls "$here/running" | wc -l >> "$here/concurrency"
echo "task started on $HOSTNAME" >> "$log"
trap 'echo "task got SIGTERM" >> "$log"; rm -f "$here/running/$$"; exit 143' TERM
sleep "$secs" & wait $!
echo "task done" >> "$log"
rm -f "$here/running/$$"
exit "$code"
"#,
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The most task processes the fake `python` in `dir` saw running at once.
pub fn max_task_processes(dir: &Path) -> u32 {
    std::fs::read_to_string(dir.join("concurrency"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|n| n.parse::<u32>().unwrap())
        .max()
        .unwrap_or(0)
}

/// The agent process, killed when dropped.
pub struct Agent {
    pub child: tokio::process::Child,
    pub metrics_addr: SocketAddr,
    pub stderr_path: PathBuf,
}

/// Starts the real binary against `fake` with `extra` flags.
pub async fn start_agent(fake: &FakeAirflow, dir: &Path, extra: &[&str]) -> Agent {
    start_agent_with_env(fake, dir, extra, &[]).await
}

/// [`start_agent`], with `env` set last (over the defaults).
pub async fn start_agent_with_env(
    fake: &FakeAirflow,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Agent {
    let versions = [
        "--airflow-version",
        "3.3.2",
        "--edge-provider-version",
        "5.1.0",
    ];
    spawn_agent(fake, dir, &[&versions, extra].concat(), env)
}

/// [`start_agent`] without the version flags: the agent reports what Airflow tells it (the
/// fake `python` has no Airflow to detect).
pub async fn start_negotiating_agent(fake: &FakeAirflow, dir: &Path, extra: &[&str]) -> Agent {
    spawn_agent(fake, dir, extra, &[])
}

fn spawn_agent(fake: &FakeAirflow, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Agent {
    let port = free_port();
    let metrics_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let stderr_path = dir.join(format!("agent-{port}.log"));
    let python = fake_python(dir);
    let mut cmd = tokio::process::Command::new(agent_binary());
    cmd.args(["--api-url", &fake.api_url()])
        .args(["--execution-api-url", "http://127.0.0.1:1/execution/"])
        .args(["--worker-name", "agent-under-test"])
        .args(["--listen", &metrics_addr.to_string()])
        .args(["--log-folder", dir.join("logs").to_str().unwrap()])
        .args(extra)
        // Defaults through the environment, so that `extra` flags can override them.
        .env("ASTRO_AGENT_HEARTBEAT_INTERVAL", "1s")
        .env("ASTRO_AGENT_IDLE_FETCH_INTERVAL", "200ms")
        .env("ASTRO_AGENT_PYTHON", &python)
        // The fake supervisor is a shell script; the pre-fork launcher has tests of its own.
        .env("ASTRO_AGENT_LAUNCH_MODE", "fresh")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .kill_on_drop(true);
    // The secret as an environment variable unless the test gives its file (both: exit 2).
    if !extra.contains(&"--jwt-secret-file") {
        cmd.env("ASTRO_AGENT_JWT_SECRET", SECRET);
    }
    let child = cmd.spawn().unwrap();
    Agent {
        child,
        metrics_addr,
        stderr_path,
    }
}

impl Agent {
    /// [`FakeAirflow::wait_until`], failing with the agent's log.
    pub async fn until(
        &self,
        fake: &FakeAirflow,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&State) -> bool,
    ) {
        if let Err(e) = fake.wait_until(what, timeout, cond).await {
            panic!("{e}\nagent log:\n{}", self.log());
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    pub async fn exit_code(&mut self, timeout: Duration) -> i32 {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "agent did not exit within {timeout:?}; log:\n{}",
                    self.log()
                )
            })
            .unwrap();
        status.code().expect("agent exited by a signal")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// GET a path on the agent's admin port; (status, body).
    pub async fn get(&self, path: &str) -> (u16, String) {
        let request = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.metrics_addr);
        try_raw_request(self.metrics_addr, &request)
            .await
            .map(|answer| (answer.status, answer.body))
            .unwrap_or_default()
    }
}

/// The `astro-agent` that cargo built for the agent's integration tests (it builds a package's
/// binaries for its integration tests only).
pub fn agent_binary() -> PathBuf {
    // Cargo 1.94 and later name it in the test's environment; earlier ones put it in the
    // folder above the test executable's `deps/`.
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_astro-agent") {
        return path.into();
    }
    let test = std::env::current_exe().unwrap();
    let deps = test.parent().unwrap();
    deps.parent().unwrap().join("astro-agent")
}
