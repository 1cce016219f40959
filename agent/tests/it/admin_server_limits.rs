//! The real `astro-agent` binary with more connections to its admin port than it has file
//! descriptors: it must not spin (CPU, log lines), and once the flood stays within its
//! descriptors the connection cap keeps enough of them for tasks to start.

use std::time::{Duration, Instant};
use test_kit::agent_process::{start_agent, Agent};
use test_kit::fake_edge_api::FakeAirflow;
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(20);
const FLOOD: usize = 300;

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The process's CPU time so far (user + system).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // utime and stime are fields 14 and 15 of stat(5): 11 and 12 after the command name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

/// Sets the open-files limit of a running process, as an operator with `prlimit` would.
fn limit_open_files(pid: u32, n: usize) {
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={n}:")])
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(status.success());
}

/// Opens [`FLOOD`] connections at once and holds those the kernel completes within 3 s: a
/// full accept queue drops the rest, and a dropped SYN is sent again after 1 s.
async fn flood(addr: std::net::SocketAddr) -> Vec<TcpStream> {
    let connects = (0..FLOOD).map(|_| {
        tokio::spawn(tokio::time::timeout(
            Duration::from_secs(3),
            TcpStream::connect(addr),
        ))
    });
    let mut held = Vec::new();
    for connect in connects.collect::<Vec<_>>() {
        if let Ok(Ok(stream)) = connect.await.unwrap() {
            held.push(stream);
        }
    }
    held
}

/// CPU time the agent used and log lines it wrote during `window`.
async fn cost_over(agent: &Agent, window: Duration) -> (Duration, usize) {
    let pid = agent.child.id().unwrap();
    let (cpu, lines) = (cpu_time(pid), agent.log().lines().count());
    tokio::time::sleep(window).await;
    (cpu_time(pid) - cpu, agent.log().lines().count() - lines)
}

#[tokio::test]
async fn more_connections_than_descriptors_neither_spin_nor_stop_tasks() {
    let fake = FakeAirflow::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&fake, dir.path(), &["--sync-slots", "1"]).await;
    let pid = agent.child.id().unwrap();
    agent
        .until(&fake, "registered", T, |s| !s.heartbeats.is_empty())
        .await;

    // Out of descriptors: a few connections fit, every further accept fails.
    let limit = open_fds(pid) + 4;
    limit_open_files(pid, limit);
    let held = flood(agent.metrics_addr).await;
    assert!(
        held.len() > limit,
        "{} connections for {limit} descriptors",
        held.len()
    );
    let (cpu, lines) = cost_over(&agent, Duration::from_secs(3)).await;
    eprintln!("descriptors exhausted: {cpu:?} CPU and {lines} log lines in 3 s");
    assert!(cpu < Duration::from_millis(300), "{cpu:?} of CPU in 3 s");
    assert!(lines < 10, "{lines} log lines in 3 s:\n{}", agent.log());
    drop(held);

    // Room for the admin server's cap and for tasks: the flood is refused, tasks run.
    let limit = open_fds(pid) + 64;
    limit_open_files(pid, limit);
    let held = flood(agent.metrics_addr).await;
    assert!(
        held.len() > limit,
        "{} connections for {limit} descriptors",
        held.len()
    );
    let (cpu, lines) = cost_over(&agent, Duration::from_secs(1)).await;
    eprintln!("over the connection cap: {cpu:?} CPU and {lines} log lines in 1 s");
    assert!(cpu < Duration::from_millis(300), "{cpu:?} of CPU in 1 s");
    fake.add_job("during-flood", 0.1, 0);
    let started = Instant::now();
    agent
        .until(&fake, "the task ran", T, |s| {
            s.states
                .get("during-flood")
                .and_then(|v| v.last())
                .map(String::as_str)
                == Some("success")
        })
        .await;
    eprintln!(
        "a task started and finished within {:?} during the flood",
        started.elapsed()
    );
    drop(held);
}
