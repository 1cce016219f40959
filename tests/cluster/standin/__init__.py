"""A kubelet stand-in: runs the Pods bound to one or more Nodes as processes of this machine.

The ``cluster`` test stage runs a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) but has no container runtime. This program takes the kubelet's place and keeps the
kubelet's rules wherever the tests can observe them: Node registration and Lease, container
environment, volumes, probes, restarts with back-off, init containers and sidecars (restartable
init containers: started in order, restarted whenever they end, stopped after the app containers
in reverse order), Pod status and Events, graceful deletion.

An "image" is a binary of this machine (``--image NAME=PATH``; a container's image is matched by the
last path component of its repository). The image's entrypoint is that binary with no CMD: with no
``command`` a container runs ``PATH args...``; a ``command`` whose first word names the image (or
the binary's file name), bare or as a path, runs the binary, any other command runs as written -- the host is the image.

Each Pod gets a sandbox like a real one: a network namespace with a veth to the node and an IP from
the node's podCIDR (routed as /32s, so Pods, the node and anything listening on the node's address
reach each other). Each container runs in that network namespace, in its own mount namespace
(volumes bind-mounted at their mountPath over the host's filesystem, a /proc of its own), UTS
namespace (hostname = Pod name) and PID namespace (no ``shareProcessNamespace``: the command is
PID 1 and sees only its own processes; a peer in another container shows PID 0 through
SO_PEERCRED), with stdin on /dev/null and stdout/stderr appended to ``container_log_path(...)``.
As with a real runtime, SIGTERM goes to that PID 1, which ignores it unless it handles it; SIGKILL
of PID 1, or its exit, ends every process of the container.

Deviations from a real kubelet, on purpose:

* No kube-proxy: ClusterIPs route nowhere. ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the
  ``KUBERNETES_PORT*`` family name the API server's own address and port instead. Other Services'
  link variables carry their ClusterIP as the kubelet's do (``service_hosts.py`` resolves names).
* No security enforcement: processes run as root whatever runAsUser, runAsGroup, fsGroup,
  capabilities, seccomp or readOnlyRootFilesystem say, and the host's filesystem stays writable.
* No root filesystem of its own: a container sees the host's files, except that the folder of
  every Pod of this stand-in (where volumes are kept) is hidden under an empty read-only tmpfs, so
  a container reaches only the volumes it mounts, at their mountPath (another container's
  mountPath shows the host's empty mount point). What is left: anything else on the host,
  including other stand-ins' Pod folders and the files of whatever started this one, stays
  readable, and /tmp (unless a volume covers it), /dev/shm and System V IPC are the host's,
  shared with every Pod.
* No resource enforcement (no cgroups): capacity and allocatable are reported, resourceFieldRef
  is served, the scheduler uses them; nothing is limited.
* A container's process is the child of a small shim (``exec_step.py``), the stand-in's child,
  which relays its exit status; ``containerID`` is ``standin://`` and the PID 1's PID on the node.
* A mountPath missing from the host is created on the host (and removed when no container uses it).
* Secret, ConfigMap and downward API volumes are refreshed on watch events (and every minute), so
  an update lands within seconds, where a kubelet may take a minute or more.
* A restarted stand-in starts the Pods already bound to its nodes afresh (new sandbox and IP,
  restart counts from zero), as after a node reboot; Pods already Succeeded or Failed stay so.
* Unsupported, reported in the containers' waiting state: hostNetwork/hostPID/hostIPC,
  shareProcessNamespace, hostPort, and volumes other than emptyDir, hostPath, secret, configMap,
  downwardAPI, projected (serviceAccountToken, secret, configMap, downwardAPI) and
  persistentVolumeClaim bound to a hostPath or local PersistentVolume (kube-controller-manager
  binds claims; the Pod waits in ContainerCreating, with a FailedMount event, until it is bound).
* Not implemented: a per-Pod /etc/hosts or resolv.conf (containers see the node's), image pulls
  (every mapped image is "already present"), image updates of a running Pod, activeDeadlineSeconds,
  in-place resize, ephemeral containers, gRPC probes, the kubelet's HTTP API (no logs/exec through
  the API server: read the log files), log rotation.

Usage (as root, inside the stage's network and mount namespace, with this folder's parent on
PYTHONPATH)::

    python -m standin --kubeconfig K --workdir DIR --node node-a --node node-b:cpu=4,memory=16Gi \\
        --cpu 2 --memory 8Gi --pods 20 --image astro-agent=BIN --image astro-sentinel=BIN

Helpers for tests: ``container_log_path()`` and ``lifecycle_log_path()`` (a Pod's timestamped
steps: sandbox, starts, probes, SIGTERM/SIGKILL, a sidecar waiting for its turn to stop, exits,
the final DELETE).

The modules, from the bottom up: ``common`` (constants, a Pod's files), ``api`` (the API client,
informers, Events, caches, tokens), ``spec`` (reading a Pod's spec), ``exec_step`` (the standalone
in-namespace step), ``process`` (container processes), ``sandbox`` (network namespaces, mount
points, volumes), ``probes`` (probes and lifecycle handlers), ``termination`` (the order in which
a Pod's containers stop), ``pod_env`` / ``pod_status`` / ``pod`` (the pod worker), ``node`` (Nodes and the machine), ``__main__`` (the command line).
"""

from __future__ import annotations

from standin.api import ApiError, Informer, KubeApi
from standin.common import Obj, container_log_path, lifecycle_log_path

__all__ = ["ApiError", "Informer", "KubeApi", "Obj", "container_log_path", "lifecycle_log_path"]
