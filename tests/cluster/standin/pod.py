"""The pod worker: one Pod on one node, from its sandbox to its final DELETE."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from standin.api import ApiError
from standin.common import BACKOFF_INITIAL, BACKOFF_MAX, ERROR_RETRY, MIN_GRACE, SYNC_PERIOD, log, micro_time, pod_dir, rfc3339
from standin.pod_env import ContainerSpecs
from standin.pod_status import StatusReports
from standin.probes import Probe, run_handler
from standin.process import spawn_container
from standin.sandbox import PodVolumes
from standin.spec import ConfigError, Unsupported, image_name, is_sidecar, unsupported_features
from standin.termination import TerminationOrder

if TYPE_CHECKING:
    from standin.common import Obj
    from standin.node import Node
    from standin.process import Process
    from standin.sandbox import Sandbox


@dataclass(eq=False)
class Container:
    """The kubelet's record of one container of a Pod, across its runs."""

    spec: Obj
    init: bool
    proc: Process | None = None  # the current run, or the last one
    last_state: Obj | None = None  # lastState.terminated: the run before ``proc``
    restarts: int = 0
    waiting: tuple[str, str] | None = None  # why it is not running (back-off, config or image error)
    started: bool = False  # the startup probe passed (or there is none)
    readiness_ok: bool = False
    stopping: bool = False  # a stop is under way: no restart decision until it ends
    stop_deadline: float = 0.0  # when that stop sends SIGKILL (monotonic)
    restart_after_kill: bool = False  # killed by a failed probe: restart unless restartPolicy is Never
    probes: list[Probe] = field(default_factory=list)
    retry_at: float = 0.0  # no start attempt before this (monotonic)
    backoff: float = 0.0
    backoff_updated: float | None = None
    image_failures: int = 0

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def sidecar(self) -> bool:
        return self.init and is_sidecar(self.spec)

    @property
    def running(self) -> bool:
        return self.proc is not None and not self.proc.done.is_set()

    @property
    def succeeded(self) -> bool:
        """Its last run has ended with exit code 0."""
        return self.proc is not None and self.proc.done.is_set() and self.proc.exit_code == 0 and not self.proc.start_error

    @property
    def ready(self) -> bool:
        if self.init and not self.sidecar:
            return self.succeeded  # the kubelet reports a completed init container as ready
        return self.running and self.started and (self.readiness_ok or "readinessProbe" not in self.spec)


class PodWorker(ContainerSpecs, StatusReports):
    """Runs one Pod on one node, from its sandbox to its final DELETE: the kubelet's pod worker.

    Its own thread owns the Pod's lifecycle (``_run``); the container processes' waiter threads,
    the probes and the stop threads report to it under ``_cond``, and it turns their reports into
    starts, restarts and status patches. Network calls happen outside the lock, so a slow API server
    never delays a SIGKILL."""

    def __init__(self, node: Node, pod: Obj) -> None:
        self.node = node
        meta = pod["metadata"]
        self.uid, self.namespace, self.name = meta["uid"], meta["namespace"], meta["name"]
        self.ref = f"{self.name}_{self.namespace}({self.uid})"  # the kubelet's format.Pod
        self.dir = pod_dir(node.machine.workdir, self.namespace, self.name, self.uid)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._cond = threading.Condition(threading.RLock())
        self._pod, self._dirty, self._removed, self._shutdown = pod, True, False, False
        self._containers = [Container(c, True) for c in pod["spec"].get("initContainers") or []]
        self._containers += [Container(c, False) for c in pod["spec"]["containers"]]
        self._volumes = PodVolumes(self)
        self._sandbox: Sandbox | None = None
        self.pod_ip = ""
        self._start_time = ""
        self._blocked: tuple[str, str] | None = None  # why no container can start (Pod-level)
        self._terminal = False  # nothing runs and nothing will be started again
        self._adopted_terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        self._stopping = False
        self._transitions: dict[str, tuple[str, str]] = {}
        self._sent: Obj | None = None
        self._retry_at = 0.0
        self.thread = threading.Thread(target=self._run, name=f"pod {self.namespace}/{self.name}", daemon=True)

    # -- reports from other threads

    def update(self, pod: Obj) -> None:
        with self._cond:
            self._pod = pod
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            if self._stopping and grace is not None:
                self._shorten_stops(float(grace))
            self._wake()

    def removed(self, pod: Obj) -> None:
        """The Pod is gone from the API (force deletion): stop it with the grace it had then."""
        with self._cond:
            self._pod, self._removed = pod, True
            self._wake()

    def shutdown(self, grace: float) -> None:
        with self._cond:
            self._shutdown = True
            self._shorten_stops(grace)
            self._wake()

    def poke(self) -> None:
        """Something the Pod may use changed (a Secret, a ConfigMap): sync again."""
        with self._cond:
            self._wake()

    def _wake(self) -> None:
        self._dirty = True
        self._cond.notify_all()

    def _shorten_stops(self, grace: float) -> None:
        bound = time.monotonic() + max(grace, MIN_GRACE)
        for c in self._containers:
            if c.stopping and c.stop_deadline > bound:
                c.stop_deadline = bound
                self.log(f"container {c.name}: grace period shortened; SIGKILL in {max(grace, MIN_GRACE):.0f}s")

    def log(self, message: str) -> None:
        log.info("%s/%s: %s", self.namespace, self.name, message)
        with open(self.dir / "lifecycle.log", "a") as f:
            f.write(f"{micro_time()} {message}\n")

    def event(self, kind: str, reason: str, message: str, c: Container | None = None) -> None:
        self.node.machine.events.emit(self.node.name, self._pod, kind, reason, message,
                                      c.name if c else "", c.init if c else False)

    # -- the lifecycle

    def _run(self) -> None:
        try:
            self._live()
            self._terminate()
        except Exception:  # noqa: BLE001 - log, then still stop what runs
            log.exception("pod worker of %s/%s failed", self.namespace, self.name)
            for c in self._containers:
                if c.proc is not None:
                    c.proc.kill_all()
            self._teardown()
        finally:
            self.node.worker_done(self)

    def _live(self) -> None:
        """Keep the Pod's containers running until it is deleted or removed or the node stops."""
        while True:
            with self._cond:
                if not self._dirty:
                    self._cond.wait(self._next_wakeup())
                self._dirty = False
                pod = self._pod
                if self._removed or self._shutdown or pod["metadata"].get("deletionTimestamp"):
                    return
            try:
                self._sync(pod)
            except Exception:  # noqa: BLE001 - retry like the kubelet's pod worker does
                log.exception("syncing %s/%s failed; retrying in %.0f s", self.namespace, self.name, ERROR_RETRY)
                self._retry_at = time.monotonic() + ERROR_RETRY

    def _next_wakeup(self) -> float:
        now = time.monotonic()
        times = [now + SYNC_PERIOD] + [t for t in [self._retry_at] + [c.retry_at for c in self._containers] if t > now]
        return max(min(times) - now, 0.05)

    def _sync(self, pod: Obj) -> None:
        if self._terminal or self._adopted_terminal:
            if not self._adopted_terminal:
                self._publish(pod)
            return
        problem = unsupported_features(pod)
        if problem is not None:
            self._block("CreateContainerError", problem, "Failed")
        elif (self._sandbox is not None or self._create_sandbox(pod)) and self._sync_volumes(pod):
            self._start_containers(pod)
            with self._cond:
                finished = self._finished(pod)
                leftovers = any(c.running or c.stopping for c in self._containers)
            if finished:
                if leftovers:  # the sidecars, or init containers of a Pod that has failed
                    self._publish(pod)
                    self._stop_all(pod, float(pod["spec"].get("terminationGracePeriodSeconds", 30)),
                                   "the app containers have ended and none will restart", pre_stop=True)
                self.log("all containers have finished and none will restart")
                self._terminal = True
                self._teardown()
        self._publish(pod)

    def _block(self, reason: str, message: str, event_reason: str) -> None:
        if self._blocked != (reason, message):
            self.log(f"cannot start: {message}")
            self.event("Warning", event_reason, message)
        self._blocked = (reason, message)
        self._retry_at = time.monotonic() + ERROR_RETRY

    def _create_sandbox(self, pod: Obj) -> bool:
        try:
            self._sandbox = self.node.network.create(self.uid)
        except Exception as e:  # noqa: BLE001 - reported, retried
            self._block("ContainerCreating", f"failed to create the Pod sandbox: {e}", "FailedCreatePodSandBox")
            return False
        self.pod_ip = self._sandbox.ip
        self._start_time = self._start_time or rfc3339()
        self.log(f"sandbox ready: netns {self._sandbox.netns}, IP {self.pod_ip}")
        return True

    def _sync_volumes(self, pod: Obj) -> bool:
        try:
            self._volumes.sync(pod, self.pod_ip)
        except (ConfigError, Unsupported, ApiError, OSError) as e:
            if not self._volumes.ready:
                self._block("ContainerCreating", str(e), "FailedMount")
                return False
            self.event("Warning", "FailedMount", str(e))  # the running containers keep the old content
        self._blocked = None
        return True

    def _start_containers(self, pod: Obj) -> None:
        """The kubelet's init container rules, then the app containers: init containers start one
        at a time in declaration order, each once the one before has completed (a regular one:
        exit code 0) or started (a sidecar: its startupProbe passed, or its process runs). Once an
        app container has run, the Pod is initialized: regular init containers never run again,
        and sidecars are restarted whenever they end, whatever the restartPolicy, without holding
        the app containers back."""
        policy = pod["spec"].get("restartPolicy", "Always")
        initialized = any(c.proc is not None for c in self._containers if not c.init)
        for c in self._containers:
            if not c.init:
                break
            if c.sidecar:
                if not c.running and not c.stopping:
                    self._try_start(pod, c)
                if initialized or c.running and c.started:
                    continue
                return
            if initialized or c.succeeded:
                continue
            if not c.running and not c.stopping and (c.proc is None or policy != "Never"):
                self._try_start(pod, c)
            return
        for c in self._containers:
            if not c.init and not c.running and not c.stopping and (c.proc is None or self._restarts(c, policy)):
                self._try_start(pod, c)

    @staticmethod
    def _restarts(c: Container, policy: str) -> bool:
        assert c.proc is not None
        if policy == "Always":
            return True
        return policy == "OnFailure" and (c.proc.exit_code != 0 or c.restart_after_kill)

    def _finished(self, pod: Obj) -> bool:
        """No app container will run again: each has ended for good, or (restartPolicy Never) a
        regular init container has failed. Whatever still runs (sidecars) is stopped then."""
        policy = pod["spec"].get("restartPolicy", "Always")
        if policy == "Never" and any(c.init and not c.sidecar and c.proc is not None and c.proc.done.is_set()
                                     and not c.succeeded for c in self._containers):
            return True
        return all(not c.running and not c.stopping and c.proc is not None and not self._restarts(c, policy)
                   for c in self._containers if not c.init)

    def _try_start(self, pod: Obj, c: Container) -> None:
        now = time.monotonic()
        if now < c.retry_at:
            return
        if c.proc is not None:  # a restart: the kubelet's crash-loop back-off (flowcontrol.Backoff)
            finished = c.proc.finished_mono
            expired = c.backoff_updated is None or finished - c.backoff_updated > 2 * BACKOFF_MAX
            if not expired and now - finished < c.backoff:
                message = f"back-off {c.backoff:.0f}s restarting failed container={c.name} pod={self.ref}"
                with self._cond:
                    c.waiting = ("CrashLoopBackOff", message)
                c.retry_at = finished + c.backoff
                self.event("Warning", "BackOff", f"Back-off restarting failed container {c.name} in pod {self.ref}", c)
                self.log(f"container {c.name}: {message}")
                return
            c.backoff = BACKOFF_INITIAL if expired else min(c.backoff * 2, BACKOFF_MAX)
            c.backoff_updated = now
        image = self.node.machine.image(c.spec["image"])
        if image is None:
            c.image_failures += 1
            c.retry_at = now + min(BACKOFF_INITIAL * 2 ** (c.image_failures - 1), BACKOFF_MAX)
            message = (f'Failed to pull image "{c.spec["image"]}": this node stand-in has no image named '
                       f'"{image_name(c.spec["image"])}" (known: {", ".join(sorted(self.node.machine.images)) or "none"})')
            with self._cond:
                c.waiting = ("ErrImagePull" if c.image_failures == 1 else "ImagePullBackOff", message)
            self.event("Warning", "Failed", message, c)
            self.log(f"container {c.name}: {message}")
            return
        self.event("Normal", "Pulled", f'Container image "{c.spec["image"]}" already present on machine', c)
        try:
            spec = self._process_spec(pod, c, image)
        except (ConfigError, Unsupported, ApiError, ValueError) as e:
            with self._cond:
                c.waiting = ("CreateContainerConfigError", str(e))
            c.retry_at = now + ERROR_RETRY
            self.event("Warning", "Failed", f"Error: {e}", c)
            self.log(f"container {c.name}: CreateContainerConfigError: {e}")
            return
        assert self._sandbox is not None
        proc = spawn_container(self._sandbox.netns, spec, self.dir / f"{c.name}.log", image.image_id())
        with self._cond:
            if c.proc is not None:
                c.last_state = c.proc.terminated()
                c.restarts += 1
            c.proc, c.waiting, c.readiness_ok, c.restart_after_kill = proc, None, False, False
            c.started = "startupProbe" not in c.spec
        self.node.machine.track(proc)
        threading.Thread(target=self._reap, args=(c, proc), name=f"reaper {c.name}", daemon=True).start()
        if proc.start_error:
            self.event("Warning", "Failed", f"Error: {proc.start_error}", c)
            self.log(f"container {c.name}: StartError: {proc.start_error}")
            return
        self.event("Normal", "Created", f"Created container: {c.name}", c)
        self.event("Normal", "Started", f"Started container {c.name}", c)
        self.log(f"container {c.name}: started, pid {proc.pid}: {json.dumps(spec['argv'])[:300]}")
        with self._cond:
            for kind in ("startup", "liveness", "readiness"):
                if f"{kind}Probe" in c.spec and (not c.init or c.sidecar):
                    c.probes.append(Probe(self, c, proc, kind, c.spec[f"{kind}Probe"]))
        hook = (c.spec.get("lifecycle") or {}).get("postStart")
        if hook:
            ok, output = run_handler(hook, c.spec, proc, self.pod_ip, self._grace_for(pod, c))
            if not ok:
                self.event("Warning", "FailedPostStartHook", f"PostStartHook failed: {output}", c)
                self._kill_async(pod, c, proc, f"Container {c.name} failed its postStart hook, will be restarted")

    # -- reports: exits, probes

    def _reap(self, c: Container, proc: Process) -> None:
        """Wait for a container's shim: it exits after the init, once nothing of the container runs."""
        returncode = proc.shim.wait()
        proc.kill_all()  # a shim killed from outside leaves its init to its parent-death signal: make sure
        with self._cond:
            proc.finish(returncode)
            for probe in c.probes:
                probe.stop()
            c.probes = []
            c.started = False
            self._wake()
        self.node.machine.untrack(proc)
        if not proc.start_error:
            self.log(f"container {c.name} (pid {proc.pid}) exited with code {proc.exit_code}")

    def probe_result(self, probe: Probe, ok: bool, output: str) -> None:
        c, kind, spec = probe.container, probe.kind, probe.spec
        with self._cond:
            if probe.stopped.is_set() or c.proc is not probe.proc or c.stopping:
                return
            probe.successes, probe.failures = (probe.successes + 1, 0) if ok else (0, probe.failures + 1)
            if not ok:
                self.event("Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {output}".rstrip(), c)
            failed = probe.failures >= int(spec.get("failureThreshold", 3))
            if kind == "readiness":
                ready = probe.successes >= int(spec.get("successThreshold", 1)) or (c.readiness_ok and not failed)
                if ready != c.readiness_ok:
                    c.readiness_ok = ready
                    self.log(f"container {c.name}: readiness probe {'succeeded' if ready else 'failed'}")
                    self._wake()
            elif kind == "startup" and ok:
                c.started = True
                probe.stop()
                self.log(f"container {c.name}: startup probe succeeded")
                for other in c.probes:
                    other.trigger()
                self._wake()
            elif failed:
                message = f"Container {c.name} failed {kind} probe, will be restarted"
                self._kill_async(self._pod, c, probe.proc, message, probe_grace=spec.get("terminationGracePeriodSeconds"))

    # -- stopping

    def _grace_for(self, pod: Obj, c: Container, probe_grace: int | None = None) -> float:
        if probe_grace is not None:
            return float(probe_grace)
        return float(pod["spec"].get("terminationGracePeriodSeconds", 30))

    def _kill_async(self, pod: Obj, c: Container, proc: Process, message: str, probe_grace: int | None = None) -> None:
        with self._cond:
            if c.stopping or proc.done.is_set():
                return
            c.stopping, c.restart_after_kill = True, True
        self.log(message)
        threading.Thread(target=self._stop_container, args=(c, proc, self._grace_for(pod, c, probe_grace), message, True),
                         name=f"stop {c.name}", daemon=True).start()

    def _stop_container(self, c: Container, proc: Process, grace: float, message: str, pre_stop: bool,
                        order: TerminationOrder | None = None) -> None:
        """Stop one container run as the kubelet's killContainer does: Killing event, preStop hook
        (within the grace period), its turn in the Pod's termination order if the whole Pod stops,
        SIGTERM to its init, SIGKILL (the whole PID namespace) once the rest of the grace period
        (never under 2 s) has passed."""
        try:
            self._stop_run(c, proc, grace, message, pre_stop, order)
        finally:
            if order is not None:
                order.ended(c.name)

    def _stop_run(self, c: Container, proc: Process, grace: float, message: str, pre_stop: bool,
                  order: TerminationOrder | None) -> None:
        with self._cond:
            c.stopping = True
            for probe in c.probes:
                probe.stop()
        self.event("Normal", "Killing", message, c)
        begin = time.monotonic()
        hook = (c.spec.get("lifecycle") or {}).get("preStop")
        if pre_stop and hook and grace > 0 and not proc.done.is_set():
            self.log(f"container {c.name}: running the preStop hook (up to {grace:.0f}s)")
            ok, output = run_handler(hook, c.spec, proc, self.pod_ip, grace)
            if not ok:
                self.event("Warning", "FailedPreStopHook", f"PreStopHook failed: {output}", c)
            self.log(f"container {c.name}: preStop hook {'done' if ok else 'failed: ' + output} after {time.monotonic() - begin:.1f}s")
        budget = grace - int(time.monotonic() - begin)
        if order is not None and budget > 0 and (waiting_for := order.pending(c.name)):
            self.log(f"container {c.name}: waits for {', '.join(waiting_for)} to stop before its SIGTERM (up to {budget:.0f}s)")
            budget -= int(order.wait_for_turn(c.name, budget))  # whole seconds, as the kubelet counts them
            late = order.pending(c.name)
            self.log(f"container {c.name}: its turn to stop" + (f", although {', '.join(late)} still run" if late else ""))
        remaining = max(budget, MIN_GRACE)
        with self._cond:
            c.stop_deadline = time.monotonic() + remaining
            if self._shutdown:
                c.stop_deadline = min(c.stop_deadline, time.monotonic() + self.node.machine.shutdown_grace)
        if not proc.done.is_set():
            self.log(f"container {c.name}: SIGTERM to pid {proc.pid}; SIGKILL in {remaining:.0f}s at {micro_time(time.time() + remaining)}")
            proc.signal(signal.SIGTERM)
        with self._cond:
            while not proc.done.is_set() and (left := c.stop_deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            exited, left = proc.done.is_set(), c.stop_deadline - time.monotonic()
        if exited:
            self.log(f"container {c.name}: exited with code {proc.exit_code}, {left:.1f}s before the SIGKILL deadline")
        else:
            self.log(f"container {c.name}: grace period over; SIGKILL to its processes")
            proc.kill_all()
            proc.done.wait()
            self.log(f"container {c.name}: killed, exit code {proc.exit_code}")
        with self._cond:
            c.stopping = False
            self._wake()

    def _terminate(self) -> None:
        """Deletion, removal from the API, or the node stopping: stop every container, tear the
        sandbox down, publish the final status and (on deletion) finish it with a DELETE."""
        with self._cond:
            pod, shutdown, removed = self._pod, self._shutdown, self._removed
            meta = pod["metadata"]
            if shutdown:
                grace, why = self.node.machine.shutdown_grace, "the node is stopping"
            else:
                grace = float(meta["deletionGracePeriodSeconds"] if meta.get("deletionGracePeriodSeconds") is not None
                              else pod["spec"].get("terminationGracePeriodSeconds", 30))
                why = "the Pod was removed from the API" if removed else f"deletion requested at {meta.get('deletionTimestamp')}"
        self._stop_all(pod, grace, why, pre_stop=not shutdown)
        self._terminal = True
        self._teardown()
        if shutdown or removed or self._adopted_terminal and not meta.get("deletionTimestamp"):
            return
        for _ in range(10):
            if self._adopted_terminal or self._publish(pod, final=True) or self.node.machine.stop.wait(2):
                break
        if meta.get("deletionTimestamp"):
            self._delete()

    def _stop_all(self, pod: Obj, grace: float, why: str, pre_stop: bool) -> None:
        """Stop every running container, all within one grace period, in the kubelet's order: each
        on its own thread at once, the sidecars' SIGTERM held back by the termination order."""
        with self._cond:
            self._stopping = True
            running = [(c, c.proc) for c in self._containers if c.running and c.proc is not None]
            order = TerminationOrder(pod["spec"], [c.name for c, _ in running])
            for c in self._containers:
                for probe in c.probes:
                    probe.stop()
                if c.stopping:
                    c.stop_deadline = min(c.stop_deadline, time.monotonic() + max(grace, MIN_GRACE))
        self.log(f"{why}: stopping {len(running)} container(s) with a grace period of {grace:.0f}s")
        stops = [threading.Thread(target=self._stop_container, args=(c, p, grace, f"Stopping container {c.name}", pre_stop, order),
                                  name=f"stop {c.name}", daemon=True) for c, p in running]
        for t in stops:
            t.start()
        for t in stops:
            t.join()
        with self._cond:
            while any(c.stopping for c in self._containers):  # a probe-triggered stop still under way
                self._cond.wait()

    def _teardown(self) -> None:
        if self._sandbox is not None:
            self.node.network.destroy(self._sandbox)
            self.log(f"sandbox {self._sandbox.netns} removed")
            self._sandbox = None
        self._volumes.remove()
        self.node.machine.mount_points.release(self.uid)
        self.node.machine.tokens.forget(self.uid)

    def _delete(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        self.log("finishing the deletion: DELETE with gracePeriodSeconds=0 and the Pod's UID as precondition")
        for attempt in range(30):
            try:
                self.node.machine.api.request("DELETE", path, body)
                return
            except ApiError as e:
                if e.status in (404, 409):
                    self.log(f"the Pod was already gone (HTTP {e.status})")
                    return
                log.warning("deleting %s/%s failed: %s", self.namespace, self.name, e)
            except Exception as e:  # noqa: BLE001 - the API server may be restarting
                log.warning("deleting %s/%s failed: %s", self.namespace, self.name, e)
            if self.node.machine.stop.wait(min(2.0 ** attempt, 30)):
                return
