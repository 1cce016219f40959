"""The kubelet stand-in's command line: ``python -m standin --kubeconfig K --workdir DIR --node ...``."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from standin.common import log
from standin.node import Machine, Node, NodeSpec
from standin.spec import parse_quantity

if TYPE_CHECKING:
    from standin.common import Obj


def _taint(text: str) -> Obj:
    key_value, _, effect = text.rpartition(":")
    key, _, value = key_value.partition("=")
    if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise argparse.ArgumentTypeError(f"taint {text!r} is not KEY[=VALUE]:EFFECT")
    return {"key": key, "effect": effect} | ({"value": value} if value else {})


def _node_spec(text: str, defaults: dict[str, str]) -> NodeSpec:
    name, _, overrides = text.partition(":")
    spec = NodeSpec(name, dict(defaults))
    for item in filter(None, overrides.split(",")):
        key, _, value = item.partition("=")
        if key == "label":
            label, _, label_value = value.partition("=")
            spec.labels[label] = label_value
        elif key == "taint":
            spec.taints.append(_taint(value))
        elif key in spec.capacity:
            spec.capacity[key] = value
        else:
            raise argparse.ArgumentTypeError(f"--node {text}: unknown item {key!r} (cpu, memory, pods, label, taint)")
    for value in spec.capacity.values():
        parse_quantity(value)
    return spec


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m standin", description="Run the Pods bound to the given Nodes as local processes (a kubelet stand-in).")
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--node", action="append", required=True,
                   metavar="NAME[:cpu=N,memory=Q,pods=N,label=KEY=VALUE,taint=KEY[=VALUE]:EFFECT]",
                   help="a Node to register and run Pods for; repeatable; after a colon: capacity overrides, "
                        "and labels and taints of this node only (each repeatable)")
    p.add_argument("--cpu", default="2", help="default cpu capacity of each node")
    p.add_argument("--memory", default="8Gi", help="default memory capacity of each node")
    p.add_argument("--pods", default="20", help="default Pod capacity of each node")
    p.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE", help="a label of every node")
    p.add_argument("--register-with-taints", default="", metavar="KEY[=VALUE]:EFFECT,...",
                   help="taints every node registers with (as the kubelet's flag of that name)")
    p.add_argument("--pod-cidr-base", default="10.244", help="the i-th node (from 0) gets BASE.i.0/24")
    p.add_argument("--host-ip", default="10.200.0.1", help="the node's InternalIP, the Pods' gateway")
    p.add_argument("--workdir", type=Path, required=True, help="Pod folders (logs, volumes) go under WORKDIR/pods")
    p.add_argument("--image", action="append", default=[], metavar="NAME=PATH",
                   help="run images whose repository ends in NAME with the binary PATH as entrypoint")
    p.add_argument("--shutdown-grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL for the containers when this process stops")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    defaults = {"cpu": args.cpu, "memory": args.memory, "pods": args.pods}
    try:
        args.nodes = [_node_spec(n, defaults) for n in args.node]
    except (argparse.ArgumentTypeError, ValueError) as e:
        p.error(str(e))
    for image in args.image:
        name, sep, path = image.partition("=")
        if not sep or not name or not os.access(path, os.X_OK):
            p.error(f"--image {image}: expected NAME=PATH to an executable")
    args.labels = dict(label.partition("=")[::2] for label in args.node_label)
    try:
        args.taints = [_taint(t) for t in filter(None, args.register_with_taints.split(","))]
    except argparse.ArgumentTypeError as e:
        p.error(f"--register-with-taints: {e}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03dZ %(levelname)s %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
    logging.Formatter.converter = time.gmtime
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            log.error("%s is missing: it is needed to build Pod sandboxes", tool)
            return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    machine = Machine(args, stop)
    machine.nodes = [Node(machine, spec, i, args.pod_cidr_base, args.labels, args.taints) for i, spec in enumerate(args.nodes)]
    machine.objects.start(stop)
    for node in machine.nodes:
        node.start()
    log.info("running Pods for node(s) %s; images: %s", ", ".join(n.name for n in machine.nodes),
             ", ".join(f"{i.name}={i.binary}" for i in machine.images.values()) or "none")
    stop.wait()
    log.info("stopping: every container gets SIGTERM, then SIGKILL after %.0f s", args.shutdown_grace)
    stoppers = [threading.Thread(target=node.stop) for node in machine.nodes]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()
    machine.kill_leftovers()
    machine.mount_points.release()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
