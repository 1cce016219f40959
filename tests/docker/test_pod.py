"""The worker Pod's shape as a podman pod, against a real Airflow 3 with the Edge provider: no
task can reach the agent's secrets.

The pod, as the chart lays out a worker (like Buildkite's agent-stack-k8s):

* an init step: the agent image runs ``astro-agent install /opt/astro-agent/bin`` into the
  ``bin`` volume;
* the **tasks** container: the user's own Airflow image, unmodified (here tasks_image.py's
  stand-in: Python and Airflow, no Edge provider, no astro-agent), whose PID 1 is
  ``/opt/astro-agent/bin/astro-agent task-host`` from that volume, listening on an abstract
  Unix socket (the chart's ``@astro-agent/task-host``; here one name per pod, since the pods
  share the host's network namespace);
* the **agent** container: the FROM-scratch agent image with ``--task-host-socket``, the only
  one with credentials — Airflow's JWT secret in a ``secrets`` volume mounted at
  ``/etc/astro-agent/secrets`` (where the chart mounts it), a variable in its ``env`` and one
  from an ``--env-file`` (Kubernetes ``env`` / ``envFrom``);
* one ``logs`` volume at the same path in both: the tasks write their logs, the agent ships
  them; and each container's own ``/tmp`` (the tasks container's a volume of its own, the
  agent's a tmpfs under its read-only root).

The containers share the network namespace (the pod's, here the host's, where the test's
Airflow listens on 127.0.0.1), IPC and UTS, but not the PID namespace: the task host only
accepts socket peers from outside its own, and the tasks cannot see the agent's processes. The
volumes are folders of the test's (emptyDir stand-ins), group 0 and setgid as the chart's
``fsGroup: 0`` makes them.

The secrets are random per run (the JWT secret is the test stack's own, which the agent signs
the tasks' tokens with). The DAG (dags/docker_canary_hunt.py) runs two tasks at once that hunt
for them through ``/proc``, open files, command lines, every file outside the image's software,
the secrets folder and each other's work files. Asserted, in both launch modes: each task ran
(state ``success`` in Airflow, its log shipped through the Edge API), found no secret, read
something (so an empty search cannot pass), imported no Edge provider (the image has none),
saw no agent process and could read none of the other task's work files; from outside, the
tasks container's ``/proc`` holds no agent process. The control: with the secrets volume
mounted into the tasks container as well, the same hunt finds the JWT secret and its tasks fail.
At the end a SIGTERM to the agent container drains the agent (PID 1 there) to exit 0.

Cost (``time bash tests/run.sh docker``, 2 cores shared with a CI run, release build up to
date): about 3 min, warm or cold — 3 min 08 s warm (the tasks image's tarball cached; load
average 14.5), 2 min 57 s cold (without it; load 7-12): assembling the tarball takes 5-9 s,
within the noise. Of that: Airflow's start 36-40 s, the tasks image's import 10-18 s (vfs copies
its 430 MB), each pod 20-50 s from trigger to ``success`` (the control about 17 s), and the
teardown about 35 s (Airflow's daemons 16 s, the podman storage). An Airflow venv not yet cached
(shared with the e2e stage) adds about 1 min.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import urllib.request
from pathlib import Path

import pytest

from harness.airflow_stack import AirflowStack
from harness.procs import free_port, wait_for
from podman_harness import AGENT_IMAGE, TASKS_IMAGE

DAG = "docker_canary_hunt"
SQUAT_DAG, AFTER_SQUAT_DAG = "docker_socket_squat", "docker_after_squat"
SIGNAL_DAG = "docker_signal_pid1"
LEAVE_BEHIND_DAG = "docker_leave_behind"
HIJACK_DAG = "docker_launcher_hijack"
RACE_DAG = "docker_work_file_race"
TASKS = ("hunt_a", "hunt_b")
QUEUE = "pod"
DAGS = Path(__file__).resolve().parent / "dags"
# Paths inside the pod.
BIN = "/opt/astro-agent/bin"
SECRETS = "/etc/astro-agent/secrets"
LOG_FOLDER = "/opt/airflow/logs"
DAGS_IN_POD = "/opt/airflow/dags"


@pytest.fixture(scope="module")
def airflow():
    stack = AirflowStack(dags_folder=DAGS)
    try:
        stack.start()
        print(f"\nAirflow up in {stack.timings['total']:.1f}s at {stack.api_base}")
        yield stack
    finally:
        stack.stop()


def _volume(path: Path, mode: int = 0o2775) -> Path:
    """A folder as an emptyDir with ``fsGroup: 0``: group 0, setgid, group-writable."""
    path.mkdir(parents=True)
    os.chown(path, 0, 0)
    path.chmod(mode)
    return path


class WorkerPod:
    """One worker pod: init step, tasks container, agent container; :meth:`remove` undoes it all."""

    def __init__(self, podman, stack: AirflowStack, name: str, folder: Path, launch_mode: str,
                 canaries: dict[str, str], secrets_in_tasks: bool = False):
        """``secrets_in_tasks`` mounts the agent's secrets volume into the tasks container too:
        the mistake the hunt must catch."""
        self.podman, self.stack, self.name = podman, stack, name
        self.port = free_port()
        self.bin = _volume(folder / "bin")
        # The pods share the host's network namespace, and so its abstract socket names.
        self.socket = f"@astro-agent-test/task-host-{name}"
        self.logs = _volume(folder / "logs")
        # The tasks container's own scratch space: nothing a task leaves in /tmp reaches the agent.
        self.tasks_tmp = _volume(folder / "tasks-tmp", 0o2777)
        # The Secret's volume: the JWT secret file, readable by group 0 (the agent's group).
        self.secrets = _volume(folder / "secrets", 0o2750)
        (self.secrets / "jwt-secret").write_text(canaries["jwt_secret"])
        (self.secrets / "jwt-secret").chmod(0o440)
        # envFrom: podman reads the file; only the variables reach the container.
        self.env_file = folder / "agent.env"
        self.env_file.write_text(f"AGENT_ENV_FROM_CANARY={canaries['env_from']}\n")
        self.env_file.chmod(0o600)
        self.launch_mode = launch_mode
        self.secrets_in_tasks = secrets_in_tasks
        self.canaries = canaries
        # The tasks container's env: the Airflow configuration tasks read (the chart's tasks.env).
        self.tasks_env = ["-e", f"AIRFLOW__CORE__DAGS_FOLDER={DAGS_IN_POD}", "-e", "AIRFLOW__CORE__LOAD_EXAMPLES=False",
                          "-e", "TMPDIR=/tmp"]
        # The chart's containerSecurityContext: no capabilities, no privilege escalation.
        self.hardened = ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]

    def start(self) -> "WorkerPod":
        p = self.podman
        # Not --share pid: each container keeps its own PID namespace.
        p("pod", "create", "--name", self.name, "--network", "host", "--share", "net,ipc,uts")
        # The init step (an init container): it must have exited 0 before the others start.
        p("run", "--rm", "--pod", self.name, "--name", f"{self.name}-install",
          *self.hardened, "--read-only", "-v", f"{self.bin}:{BIN}", AGENT_IMAGE, "install", BIN)
        p("run", "-d", "--pod", self.name, "--name", self.tasks, *self.hardened,
          "-v", f"{self.bin}:{BIN}:ro", "-v", f"{self.logs}:{LOG_FOLDER}",
          "-v", f"{self.tasks_tmp}:/tmp", "-v", f"{DAGS}:{DAGS_IN_POD}:ro", *self.tasks_env,
          *(["-v", f"{self.secrets}:{SECRETS}:ro"] if self.secrets_in_tasks else []),
          "--entrypoint", f"{BIN}/astro-agent", TASKS_IMAGE, "task-host", "--socket", self.socket)
        wait_for(lambda: self.check_running(self.tasks) or self.socket in listening_abstract_sockets(),
                 60, "the task host's socket", interval=0.25, on_timeout=lambda: self.logs_of(self.tasks))
        # Read-only as in the chart; podman puts a tmpfs on /tmp (the chart's emptyDir), /var/tmp
        # and /run.
        p("run", "-d", "--pod", self.name, "--name", self.agent, *self.hardened, "--read-only",
          "-v", f"{self.logs}:{LOG_FOLDER}", "-v", f"{self.secrets}:{SECRETS}:ro",
          "--env-file", str(self.env_file), "-e", f"AGENT_ENV_CANARY={self.canaries['env']}",
          "-e", f"ASTRO_AGENT_JWT_SECRET_FILE={SECRETS}/jwt-secret", "-e", "RUST_LOG=info", "-e", "TMPDIR=/tmp",
          AGENT_IMAGE,
          "--api-url", self.stack.edge_api_url,
          "--execution-api-url", self.stack.execution_api_url,
          "--worker-name", self.name,
          "--queues", QUEUE,
          "--sync-slots", "2",
          "--launch-mode", self.launch_mode,
          "--log-folder", LOG_FOLDER,
          "--listen", f"127.0.0.1:{self.port}",
          "--heartbeat-interval", "2s",
          # No versions given: Airflow's comes from the tasks' Python, and the Edge provider's
          # (the tasks image has none) from Airflow's answer to the registration.
          "--task-host-socket", self.socket)
        wait_for(lambda: self.check_running(self.agent) or self.check_running(self.tasks) or self.ready(),
                 90, f"agent {self.name} to be ready", interval=0.25, on_timeout=self.all_logs)
        return self

    @property
    def tasks(self) -> str:
        return f"{self.name}-tasks"

    @property
    def agent(self) -> str:
        return f"{self.name}-agent"

    def state(self, container: str) -> dict:
        """podman's State of the container ({} when there is no such container)."""
        out = self.podman("inspect", container, check=False)
        return json.loads(out.stdout)[0]["State"] if out.returncode == 0 else {}

    def check_running(self, container: str) -> None:
        """Raises (with the container's log) when the container has stopped."""
        state = self.state(container)
        if not state.get("Running"):
            raise AssertionError(f"{container} exited {state.get('ExitCode')}:\n{self.logs_of(container)}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def whole_log(self, container: str) -> str:
        out = self.podman("logs", container, check=False)
        return out.stdout + out.stderr

    def logs_of(self, container: str) -> str:
        return self.whole_log(container)[-6000:]

    def all_logs(self) -> str:
        return "\n".join(f"== {c}:\n{self.logs_of(c)}" for c in (self.tasks, self.agent))

    def processes_seen_by_tasks(self) -> list[list[str]]:
        """The command lines in the tasks container's /proc, read from inside it."""
        code = ("import json, os; print(json.dumps([open(f'/proc/{p}/cmdline', 'rb').read().decode().split('\\0')"
                " for p in os.listdir('/proc') if p.isdigit()]))")
        return json.loads(self.podman("exec", self.tasks, "python3", "-c", code).stdout)

    def stop_agent(self) -> int:
        """SIGTERM to the agent container (a Pod deletion); its exit code once it has drained."""
        self.podman("stop", "--time", "60", self.agent, timeout=120)
        return self.state(self.agent)["ExitCode"]

    def remove(self) -> None:
        self.podman("pod", "rm", "--force", "--time", "10", self.name, check=False, timeout=120)


def listening_abstract_sockets() -> set[str]:
    """The abstract socket names (``@...``) bound in this network namespace (/proc/net/unix)."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {fields[7] for fields in (line.split() for line in lines) if len(fields) > 7 and fields[7].startswith("@")}


def _canaries(airflow: AirflowStack) -> dict[str, str]:
    return {
        "jwt_secret": airflow.jwt_secret,  # the agent signs every task's token with it
        "env": "env-" + secrets.token_urlsafe(32),
        "env_from": "envfrom-" + secrets.token_urlsafe(32),
    }


@contextlib.contextmanager
def hunt_in_a_pod(podman, airflow: AirflowStack, folder: Path, mode: str, **pod_options):
    """Starts a worker pod, runs the hunt DAG on it to its end; yields (pod, run id, run state,
    task instances by id, task logs by id). Then drains the agent (asserting it exits 0),
    removes the pod and makes the run harmless."""
    canaries = _canaries(airflow)
    pod = WorkerPod(podman, airflow, f"pod-{folder.name}", folder / "pod", mode, canaries, **pod_options)
    run = None
    try:
        pod.start()
        run = airflow.client.trigger(DAG, conf={
            "reversed_canaries": [c[::-1] for c in canaries.values()],
            "log_folder": LOG_FOLDER,
        })
        state = airflow.client.wait_run(DAG, run, timeout=360)
        logs = {t: airflow.client.task_log_text(DAG, run, t) for t in TASKS}
        tis = {ti["task_id"]: ti for ti in airflow.client.task_instances(DAG, run)}
        yield pod, run, state, tis, logs
    finally:
        if run is not None:
            try:
                airflow.abandon_run(DAG, run)
            except Exception as e:  # keep tearing down
                print(f"could not clean up {run}: {e}")
        try:
            if pod.state(pod.agent).get("Running"):
                exit_code = pod.stop_agent()
                assert exit_code == 0, f"the agent did not drain to exit 0:\n{pod.logs_of(pod.agent)}"
        finally:
            pod.remove()


@pytest.mark.parametrize("mode", ["prefork", "fresh"])
def test_no_task_in_the_pod_reaches_the_agents_secrets(podman, agent_image, tasks_image, airflow, tmp_path, mode):
    with hunt_in_a_pod(podman, airflow, tmp_path, mode) as (pod, run, state, tis, logs):
        assert state == "success", (f"tis: { {t: ti['state'] for t, ti in tis.items()} }\n"
                                    + "\n".join(f"== {t}: {_found_line(log)}\n{log[-4000:]}" for t, log in logs.items())
                                    + "\n" + pod.all_logs())
        agent_log = pod.podman("logs", pod.agent, check=False)
        # The tasks' image has no Edge provider: the agent learns Airflow's from its refusal.
        agent_said = agent_log.stderr + agent_log.stdout
        assert "Airflow runs Edge provider " in agent_said and " from now on" in agent_said, agent_said[-2000:]
        for task_id in TASKS:
            assert tis[task_id]["state"] == "success"
            assert tis[task_id]["hostname"] == pod.name
            # Shipped by the agent through the Edge API: the api-server's own log folder has
            # no other way to get it.
            assert f"astro-canary-hunt task={task_id} run={run}" in logs[task_id]
            summary = airflow.client.get(
                f"/api/v2/dags/{DAG}/dagRuns/{run}/taskInstances/{task_id}/xcomEntries/return_value",
                deserialize="true", stringify="false",
            )["value"]
            print(f"{task_id}: read {len(summary['read'])} paths, refused {len(summary['refused'])}; "
                  f"the other task's id seen in {summary['partner_seen_in']}")
            assert summary["found"] == []
            assert summary["uid"] == 50000
            assert not summary["edge_provider_importable"], "the tasks image has no Edge provider"
            assert not summary["secrets_folder_exists"]
            read = summary["read"]
            # The search read something everywhere it looked: /proc, the binary's volume, the
            # log volume (its own log at least), the image's /etc.
            assert any(p.startswith("/proc/1/") for p in read), read
            assert f"{BIN}/astro-agent" in read
            assert any(p.startswith(f"{LOG_FOLDER}/") for p in read), read
            assert "/etc/passwd" in read
            # The other task is named only by its log and its processes' titles: none of its
            # work files (its workload holds its Execution API token) is readable.
            partner_files = [p for p in summary["partner_seen_in"]
                             if not p.startswith(f"{LOG_FOLDER}/") and not re.fullmatch(r"/proc/\d+/cmdline", p)]
            assert partner_files == [], partner_files
            # PID 1 is the task host; no process the task sees is the agent.
            argvs = {p["pid"]: p.get("argv", []) for p in summary["processes"]}
            assert argvs[1][:2] == [f"{BIN}/astro-agent", "task-host"], argvs[1]
            assert not [a for a in argvs.values() if _is_agent(a)], argvs
        seen = pod.processes_seen_by_tasks()
        assert seen and not [a for a in seen if _is_agent(a)], seen


def test_the_hunt_finds_a_secret_mounted_into_the_tasks_container(podman, agent_image, tasks_image, airflow,
                                                                  tmp_path):
    """The control: with the agent's secrets volume mounted into the tasks container as well,
    the same hunt finds the JWT secret and fails its tasks, so a clean hunt above means something."""
    with hunt_in_a_pod(podman, airflow, tmp_path, "prefork", secrets_in_tasks=True) as (pod, run, state, tis, logs):
        assert state == "failed"
        for task_id in TASKS:
            assert tis[task_id]["state"] == "failed", tis[task_id]
            assert f"canary #0 in {SECRETS}/jwt-secret" in _found_line(logs[task_id]), logs[task_id][-3000:]


@contextlib.contextmanager
def attacked_pod(podman, airflow: AirflowStack, folder: Path, mode: str = "prefork"):
    """A started worker pod and ``trigger(dag, conf)``, which starts a run on it and returns
    ``(dag, run id)``. Afterwards every run triggered is made harmless and the pod removed."""
    pod = WorkerPod(podman, airflow, f"pod-{folder.name}", folder / "pod", mode, _canaries(airflow))
    runs = []

    def trigger(dag: str, conf: dict | None = None) -> tuple[str, str]:
        runs.append((dag, airflow.client.trigger(dag, conf=conf)))
        return runs[-1]

    try:
        pod.start()
        yield pod, trigger
    finally:
        for run in runs:
            try:
                airflow.abandon_run(*run)
            except Exception as e:  # keep tearing down
                print(f"could not clean up {run}: {e}")
        pod.remove()


def test_a_task_cannot_take_the_task_hosts_socket_for_the_next_agent(podman, agent_image, tasks_image, airflow,
                                                                     tmp_path):
    """A task that acts (dags/docker_socket_squat.py): it takes the task host's socket and
    leaves a daemon behind to answer the agent's next connection; the agent container then
    restarts (as after an OOM kill, a crash or a failed liveness probe). Were the socket a file
    in a volume the tasks can write, the restarted agent would connect to the daemon and send it
    every later workload with its Execution API token, and no later task would run. The task
    host's abstract name cannot be taken: the task is refused, the daemon gets nothing, and the
    next, ordinary task runs."""
    with attacked_pod(podman, airflow, tmp_path) as (pod, trigger):
        squat = trigger(SQUAT_DAG, {"log_folder": LOG_FOLDER})
        assert airflow.client.wait_run(*squat, timeout=240) == "success", pod.all_logs()
        said = airflow.client.task_log_text(*squat, "squat")
        print(next((line for line in said.splitlines() if "astro-socket-squat:" in line), "(nothing said)"))
        # The agent container restarts; the kubelet would start it again, podman does here.
        pod.podman("restart", "--time", "60", pod.agent, timeout=180)
        wait_for(lambda: pod.check_running(pod.agent) or pod.ready(), 90, "the restarted agent to be ready",
                 interval=0.25, on_timeout=pod.all_logs)
        after = trigger(AFTER_SQUAT_DAG)
        try:
            state = airflow.client.wait_run(*after, timeout=180)
        except TimeoutError:
            state = "not finished within 180 s"
        capture = pod.logs / "squat-capture"
        captured = capture.read_bytes() if capture.exists() else b""
        assert captured == b"", f"the squatter received {len(captured)} bytes:\n{captured[:3000]!r}"
        assert state == "success", pod.all_logs()
        assert "astro-socket-squat: refused (EADDRINUSE" in said, said[-3000:]


def test_a_task_cannot_stop_the_tasks_of_its_worker_by_signalling_pid_1(podman, agent_image, tasks_image,
                                                                        airflow, tmp_path):
    """A task that acts (dags/docker_signal_pid1.py): it sends SIGTERM and SIGINT to PID 1 of
    its container, the task host, which stops every task of the worker on the container's stop.
    A task's signal is not the container's stop: the task host ignores it, the task running
    beside the signaller and the next one succeed, and the task host says what it ignored."""
    with attacked_pod(podman, airflow, tmp_path) as (pod, trigger):
        state, tis, said = _attack_outcome(airflow, trigger(SIGNAL_DAG), "signal_pid1", timeout=240)
        assert state == "success", f"{tis}\n{pod.all_logs()}"
        assert "astro-signal-pid1: sent" in said, said[-3000:]
        task_host_log = pod.whole_log(pod.tasks)
        for name in ("SIGTERM", "SIGINT"):
            assert f"ignored {name} from a process of this container" in task_host_log, task_host_log[-3000:]


def test_what_a_task_leaves_behind_ends_with_it(podman, agent_image, tasks_image, airflow, tmp_path):
    """A task that acts (dags/docker_leave_behind.py): it leaves a daemon behind, which would
    outlive it and every later task of the worker. PID 1 of the tasks container, the task host,
    inherits it and ends it once the tasks it shared the worker with have ended."""
    with attacked_pod(podman, airflow, tmp_path) as (pod, trigger):
        run = trigger(LEAVE_BEHIND_DAG, {"log_folder": LOG_FOLDER})
        assert airflow.client.wait_run(*run, timeout=240) == "success", pod.all_logs()
        daemon = int((pod.logs / "leftover.pid").read_text())
        alive = f"import os, sys; sys.exit(0 if os.path.exists('/proc/{daemon}') else 1)"

        def daemon_gone() -> bool:
            return pod.podman("exec", pod.tasks, "python3", "-c", alive, check=False).returncode == 1

        wait_for(daemon_gone, 60, f"the daemon (pid {daemon} in the tasks container) to end",
                 interval=1, on_timeout=pod.all_logs)
        assert "ending a process a task left behind" in pod.whole_log(pod.tasks), pod.all_logs()


@pytest.mark.parametrize("mode", ["prefork", "fresh"])
def test_a_task_cannot_hijack_the_launcher_of_the_next_tasks(podman, agent_image, tasks_image, airflow, tmp_path,
                                                             mode):
    """A task that acts (dags/docker_launcher_hijack.py): it plants a ``json`` module where the
    launcher's Python would look first, kills the pre-forked launcher and opens the new one's
    stdin again through /proc, all as the task host's user. Were the launcher's script a file in
    a folder the tasks can write, run with that folder (or the current one) first on the path,
    or its requests sent through a pipe, the next task's workload with its Execution API token
    would reach the attacker. The launcher's source travels in argv, the current folder is off
    the path, and its requests travel on a socket: nothing is captured, and the next task runs."""
    with attacked_pod(podman, airflow, tmp_path, mode) as (pod, trigger):
        state, tis, said = _attack_outcome(airflow, trigger(HIJACK_DAG, {"log_folder": LOG_FOLDER}), "hijack")
        print("\n".join(line for line in said.splitlines() if "astro-launcher-hijack:" in line))
        capture = pod.logs / "hijack-capture"
        captured = capture.read_bytes() if capture.exists() else b""
        assert captured == b"", f"the hijacker received {len(captured)} bytes:\n{captured[:3000]!r}"
        assert state == "success", f"{tis}\n{pod.all_logs()}"
        assert "astro-launcher-hijack: planted /opt/airflow/json.py" in said, said[-3000:]
        if mode == "prefork":
            # The attack's premise held: the launcher was found, killed and started again.
            assert "astro-launcher-hijack: killed launcher" in said, said[-3000:]
            assert "task launcher exited" in pod.whole_log(pod.tasks), pod.all_logs()


@pytest.mark.parametrize("mode", ["prefork", "fresh"])
def test_a_task_cannot_open_the_output_of_another_task(podman, agent_image, tasks_image, airflow, tmp_path, mode):
    """A task that acts (dags/docker_work_file_race.py): for 30 s it opens every other task's
    output it can find — named files in the task host's work folders before their names go, a
    new interpreter's stdout through /proc before it is undumpable — while three ordinary tasks
    run. Airflow 3.0's supervisor prints its workload there, token included. A task's output is
    one end of a socket pair, with no name and no way to open it again: the attacker opens
    nothing, and every task runs."""
    with attacked_pod(podman, airflow, tmp_path, mode) as (pod, trigger):
        state, tis, said = _attack_outcome(airflow, trigger(RACE_DAG, {"log_folder": LOG_FOLDER}), "race")
        line = next((line for line in said.splitlines() if "astro-work-file-race:" in line), "(nothing said)")
        print(line[:3000])
        opened_file = pod.logs / "race-opened"
        opened = json.loads(opened_file.read_text()) if opened_file.exists() else None
        assert opened == [], f"the racer opened other tasks' output: {opened}\n{line[:3000]}"
        assert state == "success", f"{tis}\n{pod.all_logs()}"
        looked = re.search(r"(\d+) scans, .* (\d+) children of PID 1", line)
        assert looked and int(looked.group(1)) > 1000, line[:3000]
        if mode == "fresh":
            # It saw the victims' interpreters (and the pause's) start: each a child of PID 1.
            assert int(looked.group(2)) >= 4, line[:3000]


def _attack_outcome(airflow: AirflowStack, run: tuple[str, str], attacker: str,
                    timeout: float = 300) -> tuple[str, dict[str, str], str]:
    """The run's state once it ended (or why not), each task's state, and the attacker task's
    log."""
    try:
        state = airflow.client.wait_run(*run, timeout=timeout)
    except TimeoutError:
        state = f"not finished within {timeout:.0f} s"
    tis = {ti["task_id"]: ti["state"] for ti in airflow.client.task_instances(*run)}
    return state, tis, airflow.client.task_log_text(*run, attacker)


def _is_agent(argv: list[str]) -> bool:
    """The agent's command line: the astro-agent binary without a subcommand of the task host."""
    return bool(argv) and os.path.basename(argv[0]) == "astro-agent" and "task-host" not in argv[1:2]


def _found_line(log: str) -> str:
    """What the hunt found, as its task log says (before its long summary)."""
    return next((line for line in log.splitlines() if line.startswith("astro-canary-hunt found:")), "(no hunt result)")
