//! The agent and its task host in two "containers": the task host in a PID namespace of its
//! own, listening on an abstract socket name (`astro-agent task-host --socket @NAME`), the agent
//! connecting with `--task-host-socket`; and the failures and attacks that shape can have — the
//! agent restarting while a task runs, the task host dying, a process of the task host's own
//! container connecting, or binding the name to receive the next agent's connection.

use nix::sys::signal::Signal;
use std::os::linux::net::SocketAddrExt;
use std::path::Path;
use std::time::Duration;
use test_kit::agent_process::{start_agent, Agent};
use test_kit::fake_edge_api::{FakeAirflow, State};
use test_kit::task_host_process::{is_listening, start_task_host, unique_socket, TaskHostProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(30);

fn states<'a>(s: &'a State, job: &str) -> &'a [String] {
    s.states.get(job).map(Vec::as_slice).unwrap_or(&[])
}

fn ended(s: &State, job: &str, state: &str) -> bool {
    states(s, job).last().is_some_and(|last| last == state)
}

/// Waits until Airflow hears that `job` runs.
async fn running(agent: &Agent, fake: &FakeAirflow, job: &str) {
    agent
        .until(fake, "the job running", T, |s| {
            states(s, job).iter().any(|st| st == "running")
        })
        .await;
}

/// The job `cut` is reported failed with `reason` in its log, and the agent runs the next job.
async fn lost_with_reason_then_work_goes_on(agent: &Agent, fake: &FakeAirflow, reason: &str) {
    agent
        .until(fake, "the lost job reported failed", T, |s| {
            ended(s, "cut", "failed")
        })
        .await;
    let log = fake.with(|s| s.logs.get("cut").cloned().unwrap_or_default());
    assert!(log.contains(reason), "the reason is in the task log: {log}");
    fake.add_job("after", 0.0, 0);
    agent
        .until(fake, "the next job runs", T, |s| {
            ended(s, "after", "success")
        })
        .await;
}

/// A worker Pod's two containers: a task host in a PID namespace of its own, listening on a
/// name no other test uses, and an agent (with `extra` flags) connected to it.
struct Worker {
    fake: FakeAirflow,
    dir: tempfile::TempDir,
    socket: String,
    host: TaskHostProcess,
    agent: Agent,
}

async fn worker(extra: &[&str]) -> Worker {
    let fake = FakeAirflow::start().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = unique_socket();
    let host = start_task_host(&socket, &dir.path().join("host.log"), true);
    host.listening(&socket).await;
    let agent = agent_on_with(&fake, dir.path(), &socket, extra).await;
    Worker {
        fake,
        dir,
        socket,
        host,
        agent,
    }
}

async fn agent_on(fake: &FakeAirflow, dir: &Path, socket: &str) -> Agent {
    agent_on_with(fake, dir, socket, &[]).await
}

async fn agent_on_with(fake: &FakeAirflow, dir: &Path, socket: &str, extra: &[&str]) -> Agent {
    start_agent(
        fake,
        dir,
        &[&["--task-host-socket", socket], extra].concat(),
    )
    .await
}

/// The abstract address of `socket` (`@NAME`).
fn address(socket: &str) -> std::os::unix::net::SocketAddr {
    std::os::unix::net::SocketAddr::from_abstract_name(socket.trim_start_matches('@')).unwrap()
}

#[tokio::test]
async fn tasks_run_in_a_task_host_of_another_pid_namespace() {
    let Worker {
        fake,
        dir: _dir,
        socket: _,
        host,
        agent,
    } = worker(&[]).await;
    fake.add_job("ok", 0.2, 0);
    fake.add_job("fails", 0.0, 3);
    agent
        .until(&fake, "both jobs reported", T, |s| {
            ended(s, "ok", "success") && ended(s, "fails", "failed")
        })
        .await;
    let log = fake.with(|s| s.logs.get("ok").cloned().unwrap_or_default());
    assert!(
        log.contains("task done"),
        "the task's log is shipped from the shared folder: {log}"
    );
    assert!(host.log().contains("an agent connected"), "{}", host.log());
}

#[tokio::test]
async fn a_process_of_the_task_hosts_own_namespace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = unique_socket();
    // The same PID namespace as this test: to the task host, the test is one of its tasks.
    let host = start_task_host(&socket, &dir.path().join("host.log"), false);
    host.listening(&socket).await;
    let stream = std::os::unix::net::UnixStream::connect_addr(&address(&socket)).unwrap();
    stream.set_nonblocking(true).unwrap();
    let mut stream = tokio::net::UnixStream::from_std(stream).unwrap();
    let hello = br#"{"type":"hello","protocol":2,"settings":{"python":"python3","execution_api_url":"http://x/","worker_name":"w","log_folder":"/tmp","mode":"fresh","slots":1,"task_env_allow":[]}}"#;
    let mut frame = (hello.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(hello);
    let _ = stream.write_all(&frame).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(T, stream.read_to_end(&mut answer)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "closed without a word: {answer:?}"
    );
    assert!(
        host.log()
            .contains("refused a connection from a process of this container"),
        "{}",
        host.log()
    );
}

/// The agent container restarts while a task runs; the new agent takes the task over. Between
/// the two, a task attacks the link (it shares the Pod's network namespace and the task host's
/// user): it binds the task host's name, to receive the next agent's connection and every later
/// workload with its token. The name is held: the bind fails, and the restarted agent reaches
/// the genuine task host.
#[tokio::test]
async fn a_restarted_agent_takes_over_the_running_task_and_no_task_can_take_its_link() {
    let Worker {
        fake,
        dir,
        socket,
        host,
        agent: first,
    } = worker(&[]).await;
    fake.add_job("long", 3.0, 0);
    running(&first, &fake, "long").await;
    let squat = std::os::unix::net::UnixListener::bind_addr(&address(&socket));
    assert_eq!(
        squat.as_ref().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::AddrInUse,
        "a task bound the task host's name"
    );
    // The agent container restarts: SIGKILL, nothing reported.
    first.signal(Signal::SIGKILL);
    drop(first);
    let second = agent_on(&fake, dir.path(), &socket).await;
    fake.add_job("next", 0.0, 0);
    second
        .until(&fake, "the running job and the next one reported", T, |s| {
            ended(s, "long", "success") && ended(s, "next", "success")
        })
        .await;
    assert!(
        second.log().contains("taking over a task"),
        "{}",
        second.log()
    );
    let log = fake.with(|s| s.logs.get("long").cloned().unwrap_or_default());
    assert!(log.contains("task done"), "{log}");
    assert_eq!(
        host.log().matches("an agent connected").count(),
        2,
        "both agents reached the genuine task host: {}",
        host.log()
    );
}

/// 24 tasks of 2 s, with jobs of `job_kib` each (a padding field in the workload), left with
/// the task host by an agent killed while they ran; a restarted agent with `slots` takes them
/// over and must report every one, as it saw it end.
async fn left_behind_and_taken_over(job_kib: usize, slots: u32) {
    const TASKS: usize = 24;
    let first_slots = TASKS.to_string();
    let Worker {
        fake,
        dir,
        socket,
        host: _host,
        agent: first,
    } = worker(&["--sync-slots", &first_slots]).await;
    let padding = "x".repeat(job_kib * 1024);
    let ids: Vec<String> = (0..TASKS).map(|i| format!("left{i:02}")).collect();
    for id in &ids {
        fake.add_job_with_command(
            id,
            serde_json::json!({
                "type": "ExecuteTask", "token": "task-token", "log_path": format!("dag_id=dag/{id}.log"),
                "fake": {"sleep": 2.0, "exit": 0}, "padding": padding,
            }),
        );
    }
    first
        .until(&fake, "every job running", T, |s| {
            ids.iter()
                .all(|id| states(s, id).iter().any(|st| st == "running"))
        })
        .await;
    // The agent container restarts: SIGKILL, nothing reported, nothing released.
    first.signal(Signal::SIGKILL);
    drop(first);
    let second_slots = slots.to_string();
    let second = agent_on_with(&fake, dir.path(), &socket, &["--sync-slots", &second_slots]).await;
    second
        .until(&fake, "every job reported by the restarted agent", T, |s| {
            ids.iter().all(|id| ended(s, id, "success"))
        })
        .await;
    assert_eq!(
        second.log().matches("taking over a task").count(),
        TASKS,
        "{}",
        second.log()
    );
}

/// More tasks left behind than the restarted agent has slots (2): it follows every one from its
/// welcome on, so a task that ends while the agent waits for a slot is still reported. (Taken
/// over one by one as slots freed, such a task's exit went unheard, its job "running" forever.)
#[tokio::test]
async fn a_restarted_agent_with_fewer_slots_reports_every_task_left_behind() {
    left_behind_and_taken_over(1, 2).await;
}

/// Tasks left behind larger than one frame can hold (24 jobs of 450 KiB, 10.8 MiB): the welcome
/// brings one task per frame, and the restarted agent learns and reports every one. In one
/// welcome frame, past the 1 MiB limit, no agent could ever connect again.
#[tokio::test]
async fn a_restarted_agent_takes_over_ten_mebibytes_of_tasks() {
    left_behind_and_taken_over(450, 24).await;
}

#[tokio::test]
async fn tasks_of_a_task_host_that_died_are_reported_failed_and_work_goes_on() {
    let Worker {
        fake,
        dir,
        socket,
        mut host,
        agent,
    } = worker(&[]).await;
    fake.add_job("cut", 60.0, 0);
    running(&agent, &fake, "cut").await;
    host.kill().await;
    // The kernel frees the name when the killed task host's socket closes.
    while is_listening(&socket) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The Pod restarts the tasks container: a new task host on the same socket.
    let _restarted = start_task_host(&socket, &dir.path().join("host2.log"), true);
    lost_with_reason_then_work_goes_on(&agent, &fake, "the task host no longer knows this task")
        .await;
}

/// The pids of `pid`'s children.
fn children(pid: u32) -> Vec<i32> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        found.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    found
}

/// A task signals PID 1 of its container, the task host, which would stop every task of the
/// worker: the signals are ignored and the running task ends well. The container's own stop,
/// from outside its PID namespace, still stops the task host.
#[tokio::test]
async fn a_task_cannot_stop_the_task_host_but_its_container_can() {
    let Worker {
        fake,
        dir: _dir,
        socket: _,
        mut host,
        agent,
    } = worker(&[]).await;
    fake.add_job("long", 3.0, 0);
    running(&agent, &fake, "long").await;
    let task_host = children(host.child.id().unwrap());
    assert_eq!(task_host.len(), 1, "unshare's one child: {task_host:?}");
    for signal in ["TERM", "INT"] {
        // As a task would: a process of the task host's PID namespace, where it is PID 1.
        let status = std::process::Command::new("nsenter")
            .args(["--target", &task_host[0].to_string(), "--pid", "--"])
            .args(["sh", "-c", &format!("kill -{signal} 1")])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} 1 from inside: {status}");
    }
    agent
        .until(&fake, "the running job reported", T, |s| {
            ended(s, "long", "success") || ended(s, "long", "failed")
        })
        .await;
    assert_eq!(
        fake.with(|s| states(s, "long").last().cloned()).as_deref(),
        Some("success"),
        "{}",
        host.log()
    );
    for signal in ["TERM", "INT"] {
        let ignored = format!("ignored SIG{signal} from a process of this container");
        assert!(host.log().contains(&ignored), "{}", host.log());
    }
    // The container's stop.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(task_host[0]), Signal::SIGTERM).unwrap();
    let stopped = tokio::time::timeout(T, host.child.wait()).await;
    assert!(matches!(stopped, Ok(Ok(_))), "{}", host.log());
    assert!(host.log().contains("SIGTERM: stopping"), "{}", host.log());
}

#[tokio::test]
async fn a_child_task_host_that_died_is_replaced_and_its_tasks_reported_failed() {
    let fake = FakeAirflow::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&fake, dir.path(), &[]).await;
    fake.add_job("cut", 60.0, 0);
    running(&agent, &fake, "cut").await;
    let host = children(agent.child.id().unwrap());
    assert_eq!(host.len(), 1, "one child, the task host: {host:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(host[0]), Signal::SIGKILL).unwrap();
    lost_with_reason_then_work_goes_on(
        &agent,
        &fake,
        "the task host (started by the agent) exited",
    )
    .await;
}

/// Kills the fake task's daemon (a `sleep`, not this test's child) when dropped, unless gone.
struct SleeperGuard(i32);

impl Drop for SleeperGuard {
    fn drop(&mut self) {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.0)).unwrap_or_default();
        if cmdline.starts_with(b"sleep\0") {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), Signal::SIGKILL);
        }
    }
}

/// A task double-forks a daemon into a session of its own, which would outlive it and every
/// later task of the worker (with the task host's user and network namespace). The task host
/// inherits it and ends it once the tasks it shared the worker with have ended; the next task
/// still runs.
#[tokio::test]
async fn what_a_task_leaves_behind_ends_with_it() {
    let fake = FakeAirflow::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&fake, dir.path(), &[]).await;
    fake.add_job_with_command(
        "litter",
        serde_json::json!({
            "type": "ExecuteTask", "token": "task-token", "log_path": "dag_id=dag/litter.log",
            "fake": {"sleep": 0.2, "exit": 0}, "leave_behind": "daemon",
        }),
    );
    agent
        .until(&fake, "the littering job reported", T, |s| {
            ended(s, "litter", "success")
        })
        .await;
    let pid_file = dir.path().join("daemon.pid");
    let daemon: i32 = test_kit::eventually(T, "the daemon's pid", || {
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse().ok());
        async move { pid }
    })
    .await;
    // Should this test fail, the daemon does not outlive it either.
    let _daemon = SleeperGuard(daemon);
    let proc_entry = format!("/proc/{daemon}");
    test_kit::eventually(T, "the daemon to end", || {
        let gone = (!Path::new(&proc_entry).exists()).then_some(());
        async move { gone }
    })
    .await;
    fake.add_job("after", 0.0, 0);
    agent
        .until(&fake, "the next job reported", T, |s| {
            ended(s, "after", "success")
        })
        .await;
    assert!(
        agent.log().contains("ending a process a task left behind"),
        "{}",
        agent.log()
    );
}

#[tokio::test]
async fn install_copies_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("bin");
    let status = std::process::Command::new(test_kit::agent_process::agent_binary())
        .arg("install")
        .arg(&target)
        .status()
        .unwrap();
    assert!(status.success());
    let copied = target.join("astro-agent");
    let version = std::process::Command::new(&copied)
        .arg("--version")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&version.stdout).starts_with("astro-agent "),
        "{version:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&copied).unwrap().permissions().mode() & 0o777,
        0o755
    );
}
