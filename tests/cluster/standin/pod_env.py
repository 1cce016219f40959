"""A container run's process spec: command, environment (env, envFrom, Service links) and mounts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from standin.common import DEFAULT_PATH, pods_root
from standin.spec import ConfigError, Unsupported, expand, field_value, resource_value, service_link_env

if TYPE_CHECKING:
    from standin.common import Obj
    from standin.node import Image
    from standin.pod import Container


class ContainerSpecs:
    """The process-spec half of :class:`standin.pod.PodWorker`."""

    def _process_spec(self, pod: Obj, c: Container, image: Image) -> Obj:
        env = self._env(pod, c.spec)
        lookup = env.get
        command = [expand(a, lookup) for a in c.spec.get("command") or []]
        args = [expand(a, lookup) for a in c.spec.get("args") or []]
        # The image's own program, named bare or by its path in the image (the entrypoint a
        # Dockerfile gives, e.g. /usr/local/bin/astro-agent): the mapped binary.
        if command and Path(command[0]).name in (image.name, image.binary.name):
            command[0] = str(image.binary)
        argv = (command or [str(image.binary)]) + args
        mounts = []
        for vm in c.spec.get("volumeMounts") or []:
            source = self._volumes.path(pod, vm["name"])
            sub = vm.get("subPath") or expand(vm.get("subPathExpr") or "", lookup)
            if ".." in Path(sub).parts or sub.startswith("/"):
                raise ConfigError(f"subPath {sub!r} must be a relative path inside the volume")
            if sub:
                source = source / sub
                if not os.path.lexists(source):
                    source.mkdir(parents=True)  # the kubelet creates a missing subPath as a directory
                source = source.resolve()
            mounts.append({"source": str(source), "target": vm["mountPath"], "file": not source.is_dir(),
                           "readOnly": bool(vm.get("readOnly")) or self._volumes.read_only(pod, vm["name"])})
        mounts.sort(key=lambda m: len(Path(m["target"]).parts))
        targets = [Path(m["target"]) for m in mounts]
        for m, target in zip(mounts, targets):
            if not any(other in target.parents for other in targets):  # else it lives inside that volume
                self.node.machine.mount_points.acquire(self.uid, target, m["file"])
        hostname = pod["spec"].get("hostname") or self.name
        # The Pods' folders hold every volume's host-side copy: hidden, so that a container reaches
        # only the volumes it mounts.
        hidden = [str(pods_root(self.node.machine.workdir).resolve())]
        return {"argv": argv, "env": {"PATH": DEFAULT_PATH, "HOSTNAME": hostname} | env, "mounts": mounts,
                "hidden": hidden, "hostname": hostname, "cwd": c.spec.get("workingDir") or "/"}

    def _env(self, pod: Obj, spec: Obj) -> dict[str, str]:
        """The kubelet's makeEnvironmentVariables: envFrom, then env (with $(VAR) expansion over the
        variables declared so far and the service variables), then the service variables."""
        machine, namespace = self.node.machine, self.namespace
        machine.objects.services.synced.wait(30)
        service_env = service_link_env("kubernetes", machine.api_host, [{"name": "https", "port": machine.api_port}])
        if pod["spec"].get("enableServiceLinks", True):
            for svc in machine.objects.services.items():
                ip, ports = svc["spec"].get("clusterIP"), svc["spec"].get("ports") or []
                if svc["metadata"]["namespace"] == namespace and ip and ip != "None" and ports and not (
                        namespace == "default" and svc["metadata"]["name"] == "kubernetes"):  # see the module docstring
                    service_env |= service_link_env(svc["metadata"]["name"], ip, ports)
        sources: dict[tuple[str, str], dict[str, bytes] | None] = {}

        def source(kind: str, name: str) -> dict[str, bytes] | None:
            if (kind, name) not in sources:
                get = machine.objects.secret_data if kind == "secret" else machine.objects.config_map_data
                sources[(kind, name)] = get(namespace, name)
            return sources[(kind, name)]

        env: dict[str, str] = {}
        for ef in spec.get("envFrom") or []:
            kind, ref = ("configmap", ef["configMapRef"]) if "configMapRef" in ef else ("secret", ef["secretRef"])
            data = source(kind, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind} "{ref["name"]}" not found')
            env |= {ef.get("prefix", "") + k: v.decode(errors="replace") for k, v in data.items()}
        for var in spec.get("env") or []:
            value_from = var.get("valueFrom")
            if var.get("value") or not value_from:
                env[var["name"]] = expand(var.get("value", ""), lambda n: env.get(n, service_env.get(n)))
            elif "fieldRef" in value_from:
                env[var["name"]] = field_value(pod, value_from["fieldRef"]["fieldPath"], self.pod_ip, machine.host_ip)
            elif "resourceFieldRef" in value_from:
                env[var["name"]] = resource_value(pod, value_from["resourceFieldRef"], spec["name"], self.node.allocatable)
            elif "configMapKeyRef" in value_from or "secretKeyRef" in value_from:
                kind, ref = (("configmap", value_from["configMapKeyRef"]) if "configMapKeyRef" in value_from
                             else ("secret", value_from["secretKeyRef"]))
                data = source(kind, ref["name"])
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    if data is None:
                        raise ConfigError(f'{kind} "{ref["name"]}" not found')
                    label = "ConfigMap" if kind == "configmap" else "Secret"
                    raise ConfigError(f"couldn't find key {ref['key']} in {label} {namespace}/{ref['name']}")
                env[var["name"]] = data[ref["key"]].decode(errors="replace")
            else:
                raise Unsupported(f"env {var['name']}: {next(iter(value_from))} is not supported by this node stand-in")
        return env | {k: v for k, v in service_env.items() if k not in env}
