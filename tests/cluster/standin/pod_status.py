"""What a pod worker reports: the Pod's phase, conditions and container statuses."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from standin.api import ApiError
from standin.common import ERROR_RETRY, log, rfc3339
from standin.spec import is_sidecar

if TYPE_CHECKING:
    from standin.common import Obj
    from standin.pod import Container


def pod_phase(spec: Obj, init_statuses: list[Obj], statuses: list[Obj], terminal: bool, initialized: bool) -> str:
    """The kubelet's getPhase. Sidecars count as running while they run; one that has ended
    counts for nothing (it is restarted, or the Pod is over); one not started yet keeps the Pod
    Pending until the Pod is ``initialized`` (an app container has run)."""
    policy = spec.get("restartPolicy", "Always")
    sidecars = {c["name"] for c in spec.get("initContainers") or [] if is_sidecar(c)}
    pending_init = failed_init = pending_sidecars = 0
    running = waiting = stopped = succeeded = 0
    for s in init_statuses:
        state, last = s["state"], s["lastState"]
        if s["name"] in sidecars:
            if "running" in state:
                running += 1
                pending_sidecars += not s["started"]
            elif "waiting" in state and "terminated" not in last:
                pending_sidecars += 1
                waiting += 1
        elif "terminated" in state:
            failed_init += state["terminated"]["exitCode"] != 0
        elif "waiting" in state and "terminated" in last:
            failed_init += last["terminated"]["exitCode"] != 0
        else:
            pending_init += 1
    for s in statuses:
        state, last = s["state"], s["lastState"]
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            succeeded += state["terminated"]["exitCode"] == 0
        elif "terminated" in last:
            stopped += 1
        else:
            waiting += 1
    if failed_init and policy == "Never":
        return "Failed"
    if pending_init or pending_sidecars and not initialized or waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if terminal:
            return "Succeeded" if stopped == succeeded else "Failed"
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        return "Failed" if policy == "Never" else "Running"
    return "Pending"


def with_deletions(status: Obj) -> Obj:
    """A Pod status as a strategic merge patch that also removes what the new status lacks, as the
    kubelet's computed patches do: conditions merge by type, so a reason or message left out would
    survive from the old status; podIPs/hostIPs merge by ip, so a new sandbox's IP would be added
    to the old one. (Container statuses are atomic lists: they are replaced whole anyway.)"""
    patch = dict(status)
    patch["conditions"] = [{"reason": None, "message": None} | c for c in status["conditions"]]
    for key in ("podIPs", "hostIPs"):
        if key in status:
            patch[key] = [{"$patch": "replace"}, *status[key]]
    return patch


def _conditions(status: Obj) -> dict[str, str]:
    """The phase and each condition's status, as a status holds them."""
    return {"phase": status.get("phase", "")} | {c["type"]: c["status"] for c in status.get("conditions") or []}


def _disagrees(held: Obj, ours: Obj) -> bool:
    """Whether the API server's status says otherwise than ours on what the kubelet sets (the
    scheduler's and other controllers' own conditions left out)."""
    theirs = _conditions(held)
    return any(theirs.get(key) != value for key, value in _conditions(ours).items())


class StatusReports:
    """The status half of :class:`standin.pod.PodWorker`."""

    # -- status

    def _publish(self, pod: Obj, final: bool = False) -> bool:
        """Patch the Pod's status if it changed (the uid in the patch is the kubelet's precondition);
        returns False when it should be tried again."""
        with self._cond:
            status = self._status(pod, final)
        # As the kubelet's status manager reconciles: written again when the Pod as the API
        # server holds it says otherwise -- the node lifecycle controller marks a Pod not Ready
        # when its Node stopped reporting (an API server away for longer than the grace period),
        # and only the kubelet sets it Ready again.
        if status == self._sent and not _disagrees(pod.get("status") or {}, status):
            return True
        try:
            self.node.machine.api.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
                                          {"metadata": {"uid": self.uid}, "status": with_deletions(status)},
                                          patch="strategic")
            self._sent = status
            return True
        except ApiError as e:
            if e.status in (404, 409):
                log.info("status of %s/%s not written: the Pod is gone (HTTP %d)", self.namespace, self.name, e.status)
                return True
            log.warning("status of %s/%s not written: %s", self.namespace, self.name, e)
        except Exception as e:  # noqa: BLE001 - the API server may be restarting
            log.warning("status of %s/%s not written: %s", self.namespace, self.name, e)
        self._retry_at = time.monotonic() + ERROR_RETRY
        return False

    def _container_status(self, c: Container, has_init_containers: bool, final: bool) -> Obj:
        s: Obj = {"name": c.name, "image": c.spec["image"], "imageID": "", "ready": c.ready,
                  "restartCount": c.restarts, "started": c.running and c.started, "state": {}, "lastState": {}}
        p = c.proc
        if p is not None:
            s["imageID"], s["containerID"] = p.image_id, p.container_id
        if p is not None and not p.done.is_set():
            s["state"] = {"running": {"startedAt": rfc3339(p.started_at)}}
            s["lastState"] = {"terminated": c.last_state} if c.last_state else {}
        elif p is not None and (c.waiting is None or final):
            s["state"] = {"terminated": p.terminated()}
            s["lastState"] = {"terminated": c.last_state} if c.last_state else {}
        elif final:  # the kubelet's TerminatePod: a container that never ended is reported as lost
            s["state"] = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                         "message": "The container could not be located when the pod was terminated"}}
        else:
            reason, message = c.waiting or self._blocked or (("PodInitializing", "") if has_init_containers
                                                             else ("ContainerCreating", ""))
            s["state"] = {"waiting": {"reason": reason} | ({"message": message} if message else {})}
            s["lastState"] = {"terminated": p.terminated()} if p is not None else {}
        return s

    def _status(self, pod: Obj, final: bool) -> Obj:
        inits = [c for c in self._containers if c.init]
        init_st = [self._container_status(c, bool(inits), final) for c in inits]
        st = [self._container_status(c, bool(inits), final) for c in self._containers if not c.init]
        initialized = any(c.proc is not None for c in self._containers if not c.init)
        phase = pod_phase(pod["spec"], init_st, st, self._terminal, initialized)
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            phase = pod["status"]["phase"]  # a terminal phase never changes
        elif final and phase not in ("Succeeded", "Failed"):
            phase = "Failed"
        status: Obj = {"phase": phase, "hostIP": self.node.machine.host_ip,
                       "hostIPs": [{"ip": self.node.machine.host_ip}], "containerStatuses": st,
                       "conditions": self._conditions(pod, init_st, st, phase),
                       "observedGeneration": pod["metadata"].get("generation", 1)}
        if init_st:
            status["initContainerStatuses"] = init_st
        if self.pod_ip:
            status |= {"podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}]}
        if self._start_time:
            status["startTime"] = self._start_time
        return status

    def _conditions(self, pod: Obj, init_st: list[Obj], st: list[Obj], phase: str) -> list[Obj]:
        def names(items: list[str]) -> str:
            return "[" + " ".join(items) + "]"

        sidecars = {c["name"] for c in pod["spec"].get("initContainers") or [] if is_sidecar(c)}
        # A sidecar is initialized once started, a regular init container once it exited 0.
        incomplete = [s["name"] for s in init_st
                      if (not s["started"] if s["name"] in sidecars else s["state"].get("terminated", {}).get("exitCode") != 0)]
        any_started = any("running" in s["state"] or "terminated" in s["state"] or s["lastState"] for s in st)
        if phase == "Succeeded" or any_started or not incomplete:
            initialized = ("True", "PodCompleted" if phase == "Succeeded" and init_st else "", "")
        else:
            initialized = ("False", "ContainersNotInitialized", f"containers with incomplete status: {names(incomplete)}")
        # Sidecars count toward readiness, listed first as the kubelet does.
        unready = [s["name"] for s in init_st if s["name"] in sidecars and not s["ready"]] + [s["name"] for s in st if not s["ready"]]
        if phase in ("Succeeded", "Failed"):
            containers_ready = ("False", "PodCompleted" if phase == "Succeeded" else "PodFailed", "")
        elif unready:
            containers_ready = ("False", "ContainersNotReady", f"containers with unready status: {names(unready)}")
        else:
            containers_ready = ("True", "", "")
        ready = containers_ready
        if ready[0] == "True":
            existing = {c["type"]: c for c in pod.get("status", {}).get("conditions") or []}
            for gate in pod["spec"].get("readinessGates") or []:
                kind = gate["conditionType"]
                if kind not in existing:
                    ready = ("False", "ReadinessGatesNotReady", f'corresponding condition of pod readiness gate "{kind}" does not exist.')
                elif existing[kind].get("status") != "True":
                    ready = ("False", "ReadinessGatesNotReady",
                             f'the status of pod readiness gate "{kind}" is not "True", but {existing[kind].get("status")}')
        sandbox = ("True" if self._sandbox is not None else "False", "", "")
        out = []
        for kind, (value, reason, message) in (("PodReadyToStartContainers", sandbox), ("Initialized", initialized),
                                                ("Ready", ready), ("ContainersReady", containers_ready)):
            if self._transitions.get(kind, ("",))[0] != value:
                self._transitions[kind] = (value, rfc3339())
            condition = {"type": kind, "status": value, "lastTransitionTime": self._transitions[kind][1],
                         "observedGeneration": pod["metadata"].get("generation", 1)}
            out.append(condition | ({"reason": reason} if reason else {}) | ({"message": message} if message else {}))
        return out
