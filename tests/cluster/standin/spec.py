"""Reading a Pod's spec: quantities, resource and field references, `$(VAR)` expansion, Service
link variables, and what the stand-in does not support."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from fractions import Fraction
from math import ceil
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from standin.common import Obj


def parse_quantity(text: str | int | float) -> Fraction:
    """A Kubernetes resource quantity ("250m", "1.5Gi", "2e3") as an exact number."""
    m = re.fullmatch(r"([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?", str(text).strip())
    if not m:
        raise ValueError(f"invalid quantity {text!r}")
    number = Fraction(m[1])
    if m[2]:
        return number * Fraction(10) ** int(m[2][1:])
    binary = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
    if m[3] in binary:
        return number * 1024 ** binary[m[3]]
    decimal = {"n": -9, "u": -6, "m": -3, None: 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
    return number * Fraction(10) ** decimal[m[3]]


def resource_value(pod: Obj, ref: Obj, container: str, allocatable: dict[str, Fraction]) -> str:
    """A resourceFieldRef as the kubelet renders it: limits default to the node's allocatable, and
    the value is divided by the divisor and rounded up (cpu in millicores first)."""
    name = ref.get("containerName") or container
    spec = next((c for c in pod["spec"]["containers"] + (pod["spec"].get("initContainers") or []) if c["name"] == name), None)
    if spec is None:
        raise ConfigError(f'resourceFieldRef names an unknown container "{name}"')
    kind, _, resource = ref["resource"].partition(".")
    quantity = ((spec.get("resources") or {}).get(kind) or {}).get(resource)
    value = parse_quantity(quantity) if quantity is not None else (allocatable.get(resource, Fraction(0)) if kind == "limits" else Fraction(0))
    divisor = parse_quantity(ref.get("divisor") or "1") or Fraction(1)
    if resource == "cpu":
        return str(ceil(ceil(value * 1000) / ceil(divisor * 1000)))
    return str(ceil(ceil(value) / ceil(divisor)))


def format_map(values: dict[str, str]) -> str:
    """Labels or annotations as a downward API file: sorted ``key="value"`` lines (Go's %q)."""
    return "\n".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(values.items()))


def field_value(pod: Obj, path: str, pod_ip: str, host_ip: str) -> str:
    """A downward API fieldRef, for env (single keys) and volumes (whole label/annotation maps)."""
    meta, spec = pod["metadata"], pod["spec"]
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return (meta.get(m[1]) or {}).get(m[2], "")
    values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
              "metadata.labels": format_map(meta.get("labels") or {}),
              "metadata.annotations": format_map(meta.get("annotations") or {}),
              "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": pod_ip, "status.podIPs": pod_ip, "status.hostIP": host_ip, "status.hostIPs": host_ip}
    if path not in values:
        raise Unsupported(f"fieldRef {path!r} is not supported by this node stand-in")
    return values[path]


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """``$(VAR)`` expansion exactly as the kubelet does it: ``$$`` is a literal ``$``, and an
    unknown or unclosed reference stays as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            end = text.find(")", i + 2) if nxt == "(" else -1
            if nxt == "$":
                out.append("$")
            elif end != -1:
                name = text[i + 2:end]
                value = lookup(name)
                out.append(f"$({name})" if value is None else value)
                i = end + 1
                continue
            else:
                out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def service_link_env(name: str, ip: str, ports: list[Obj]) -> dict[str, str]:
    """The kubelet's (Docker links style) variables for one Service."""
    prefix = name.upper().replace("-", "_")
    env = {f"{prefix}_SERVICE_HOST": ip, f"{prefix}_SERVICE_PORT": str(ports[0]["port"])}
    for p in ports:
        if p.get("name"):
            env[f"{prefix}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p["port"])
    host = f"[{ip}]" if ":" in ip else ip
    for i, p in enumerate(ports):
        protocol = p.get("protocol") or "TCP"
        url = f"{protocol.lower()}://{host}:{p['port']}"
        if i == 0:
            env[f"{prefix}_PORT"] = url
        base = f"{prefix}_PORT_{p['port']}_{protocol.upper()}"
        env |= {base: url, f"{base}_PROTO": protocol.lower(), f"{base}_PORT": str(p["port"]), f"{base}_ADDR": ip}
    return env


class ConfigError(Exception):
    """A Pod references an object or key that does not exist: CreateContainerConfigError for env,
    FailedMount for volumes. The kubelet retries; so does the stand-in."""


class Unsupported(Exception):
    """A Pod asks for something this stand-in does not do."""


def unsupported_features(pod: Obj) -> str | None:
    spec = pod["spec"]
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            return f"{flag} Pods are not supported by this node stand-in (every Pod gets its own namespaces)"
    if spec.get("shareProcessNamespace"):
        return "shareProcessNamespace is not supported by this node stand-in (every container gets its own PID namespace)"
    for c in spec["containers"] + (spec.get("initContainers") or []):
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                return f'container "{c["name"]}" asks for hostPort {p["hostPort"]}: host ports are not supported by this node stand-in'
    return None


def is_sidecar(container: Obj) -> bool:
    """A restartable init container (``restartPolicy: Always`` in ``initContainers``)."""
    return container.get("restartPolicy") == "Always"


def image_name(image: str) -> str:
    """The last path component of an image's repository: ``registry:5000/x/astro-agent:1.2`` ->
    ``astro-agent``."""
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
