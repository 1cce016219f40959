#!/usr/bin/env python3
"""Keeps a hosts file naming every Service after one of its ready endpoints: cluster DNS for the
``cluster`` test stage.

The stage has no cluster DNS and no kube-proxy, so Service names resolve straight to an endpoint:
each Service gets a line ``IP name.ns.svc name.ns.svc.cluster.local name.ns``, where IP is the first
ready IPv4 address of its EndpointSlices (slices in name order; an endpoint whose ``ready`` is unset
counts as ready, as the API defines). Services without a selector count too: the EndpointSlices
their hand-made ones, or those kube-controller-manager mirrors from hand-made Endpoints, are read
like any other. Consequences a test must keep in mind:

* a client reaches the endpoint's port, not the Service's: a Service's ``port`` must equal its
  ``targetPort`` for a connection by name to work;
* a Service with no ready endpoint has no line (a lookup fails, where real DNS would answer with a
  ClusterIP that refuses connections); ExternalName Services have none either;
* short names (``name`` alone, resolved through search domains) are not served: use ``name.ns``.

The file is rewritten in place (write at offset 0, then truncate) rather than replaced by a rename,
because the stage bind-mounts it over /etc/hosts, and a bind mount keeps the inode it was given.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from standin import Informer, KubeApi, Obj

log = logging.getLogger("service-hosts")

BASE_LINES = ["127.0.0.1 localhost", "::1 localhost"]


def first_ready_address(slices: list[Obj]) -> str | None:
    for s in sorted(slices, key=lambda s: s["metadata"]["name"]):
        if s.get("addressType") != "IPv4":
            continue
        for endpoint in s.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is not False and endpoint.get("addresses"):
                return endpoint["addresses"][0]
    return None


def render(services: list[Obj], slices: list[Obj], domain: str) -> str:
    """The hosts file for these Services and EndpointSlices."""
    by_service: dict[tuple[str, str], list[Obj]] = {}
    for s in slices:
        owner = (s["metadata"].get("labels") or {}).get("kubernetes.io/service-name")
        if owner:
            by_service.setdefault((s["metadata"]["namespace"], owner), []).append(s)
    lines = list(BASE_LINES)
    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        if svc["spec"].get("type") == "ExternalName":
            continue
        address = first_ready_address(by_service.get((ns, name), []))
        if address:
            lines.append(f"{address} {name}.{ns}.svc {name}.{ns}.svc.{domain} {name}.{ns}")
    return "\n".join(lines) + "\n"


def rewrite_in_place(path: Path, text: str) -> None:
    """Replace a file's content without replacing its inode (it may be bind-mounted elsewhere)."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


class ServiceHosts:
    """Watches Services and EndpointSlices in all namespaces and rewrites the hosts file whenever
    what it should say changes."""

    def __init__(self, api: KubeApi, hosts_file: Path, domain: str) -> None:
        self._hosts_file, self._domain = hosts_file, domain
        self._lock = threading.Lock()
        self._written: str | None = None
        self._services = Informer(api, "/api/v1/services", on_change=self._changed)
        self._slices = Informer(api, "/apis/discovery.k8s.io/v1/endpointslices", on_change=self._changed)

    def start(self, stop: threading.Event) -> None:
        self._write()
        self._services.start(stop)
        self._slices.start(stop)

    def _changed(self, _kind: str, _obj: Obj) -> None:
        self._write()

    def _write(self) -> None:
        with self._lock:
            text = render(self._services.items(), self._slices.items(), self._domain)
            if text != self._written:
                rewrite_in_place(self._hosts_file, text)
                self._written = text
                log.info("%s: %d Service name(s)", self._hosts_file, text.count("\n") - len(BASE_LINES))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="Keep a hosts file naming each Service after a ready endpoint.")
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--hosts-file", type=Path, required=True)
    p.add_argument("--cluster-domain", default="cluster.local")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03dZ %(levelname)s %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
    logging.Formatter.converter = time.gmtime
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ServiceHosts(KubeApi(args.kubeconfig), args.hosts_file, args.cluster_domain).start(stop)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
