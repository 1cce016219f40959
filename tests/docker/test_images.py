"""The container images in docker/, built for real with podman (nothing is pulled: every stage
they build is ``FROM scratch``; see conftest.py for podman and the static binaries).

Both images ship one static binary (glibc, ``+crt-static``) — ``$ASTRO_SENTINEL_BIN`` /
``$ASTRO_AGENT_BIN`` from the test command's one release build (tests/lib/cargo-target.sh), else
built here with the same flags — taken with ``--build-arg BINARY_FROM=context``. Checks: the
user, the entrypoint, no command, the image holds the one binary (no shell).

Sentinel: the container runs on the host network against an in-test fake of Airflow's REST API
reached by a host name (``/etc/hosts``, glibc's built-in ``files`` module) and by a name that
only an in-test DNS server on 127.0.0.1:53 knows (``/etc/resolv.conf``, the built-in ``dns``
module), and serves the backlog.

Agent: ``--version`` as the image's user, and ``install DIR`` (the worker Pod's init step)
copies the binary into a volume. The agent at work in a Pod, beside a tasks container, is
test_pod.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import struct
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from podman_harness import AGENT_IMAGE, REPO, SENTINEL_IMAGE, has_interpreter

TOKEN = "docker-test-token"


@pytest.mark.parametrize("name", ["astro-sentinel", "astro-agent"])
def test_the_binaries_are_static(name, request):
    binary = request.getfixturevalue(f"static_{name.removeprefix('astro-')}")
    assert not has_interpreter(binary), "needs a dynamic loader: not usable FROM scratch"
    out = subprocess.run([str(binary), "--version"], check=True, stdout=subprocess.PIPE, text=True).stdout
    assert out.startswith(f"{name} ")


# ---- the Sentinel image ---------------------------------------------------------------------


def test_sentinel_image_user_and_entrypoint(sentinel_image):
    config = sentinel_image["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["/usr/local/bin/astro-sentinel"]
    assert not config.get("Cmd")
    assert "39092/tcp" in config.get("ExposedPorts", {})


def test_sentinel_image_holds_only_the_binary(podman, sentinel_image, tmp_path):
    files = podman.exported_files(SENTINEL_IMAGE, tmp_path / "fs.tar")
    assert files == ["usr/local/bin/astro-sentinel"], files


class FakeAirflow(BaseHTTPRequestHandler):
    """Airflow's REST API v2 count: 3 queued and 2 running on every queue."""

    protocol_version = "HTTP/1.1"
    counts = {"queued": 3, "running": 2}

    def log_message(self, *args):
        pass

    def do_GET(self):
        if not self.path.startswith("/api/v2/dags/~/dagRuns/~/taskInstances") or \
                self.headers.get("Authorization") != f"Bearer {TOKEN}":
            body, status = b'{"detail": "no"}', 404
        else:
            # Several `state` parameters list the task instances in any of them, as Airflow does,
            # a page at a time (`limit`, `offset`; at most 100, Airflow's default page limit).
            states = re.findall(r"state=(\w+)", self.path)
            rows = [{"id": f"{state}-{i}", "state": state, "hostname": "", "pool_slots": 1,
                     "queued_when": "2026-01-01T00:00:00Z"}
                    for state in states for i in range(self.counts.get(state, 0))]
            offset = int((re.findall(r"offset=(\d+)", self.path) or ["0"])[0])
            limit = min(100, int((re.findall(r"limit=(\d+)", self.path) or ["100"])[0]))
            body = json.dumps({"task_instances": rows[offset:offset + limit], "total_entries": len(rows)}).encode()
            status = 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def dns_server(name: str) -> socket.socket | None:
    """A UDP DNS server on 127.0.0.1:53 answering A queries for ``name`` with 127.0.0.1
    (NXDOMAIN otherwise); None when port 53 is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.1", 53))
    except OSError:
        sock.close()
        return None
    wanted = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"

    def serve():
        while True:
            try:
                query, peer = sock.recvfrom(512)
            except OSError:
                return
            qid, qtype_at = query[:2], 12 + query[12:].index(b"\0") + 1
            qname, qtype = query[12:qtype_at], struct.unpack_from(">H", query, qtype_at)[0]
            question = query[12:qtype_at + 4]
            if qname.lower() == wanted and qtype == 1:
                answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton("127.0.0.1")
                sock.sendto(qid + b"\x81\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + question + answer, peer)
            elif qname.lower() == wanted:  # AAAA etc.: the name exists, no such record
                sock.sendto(qid + b"\x81\x80" + struct.pack(">HHHH", 1, 0, 0, 0) + question, peer)
            else:
                sock.sendto(qid + b"\x81\x83" + struct.pack(">HHHH", 1, 0, 0, 0) + question, peer)

    threading.Thread(target=serve, daemon=True).start()
    return sock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sentinel_container_resolves_names_and_serves_the_backlog(podman, sentinel_image, tmp_path):
    fake = ThreadingHTTPServer(("127.0.0.1", 0), FakeAirflow)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    dns_name = "airflow.astro-dns.test"
    dns = dns_server(dns_name)
    port = free_port()
    (tmp_path / "tokens").write_text("keda-token\n")
    workers = [{"name": "by-hosts", "queues": ["a"], "syncSlots": 2}]
    config = {
        "refreshInterval": "500ms", "stalenessLimit": "10s",
        "source": {"type": "airflow-api", "airflowApi": {
            "url": f"http://{dns_name if dns else 'airflow-by-hosts.test'}:{fake.server_address[1]}"}},
        "auth": {"staticTokensFile": "/config/tokens"},
        "workers": workers,
    }
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    os.chmod(tmp_path, 0o755)
    for f in ("tokens", "config.yaml"):
        os.chmod(tmp_path / f, 0o644)
    extra = []
    if dns:
        (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        extra = ["-v", f"{tmp_path / 'resolv.conf'}:/etc/resolv.conf:ro"]
    else:
        extra = ["--add-host", "airflow-by-hosts.test:127.0.0.1"]
    cid = podman("run", "-d", "--network", "host", "-v", f"{tmp_path}:/config:ro", *extra,
                 "-e", f"ASTRO_SENTINEL_AIRFLOW_TOKEN={TOKEN}", SENTINEL_IMAGE,
                 "--config", "/config/config.yaml", "--listen", f"127.0.0.1:{port}").stdout.strip()
    try:
        deadline = time.monotonic() + 60
        answer, last = None, ""
        while time.monotonic() < deadline:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/workers/by-hosts",
                                         headers={"Authorization": "Bearer keda-token"})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    answer = json.loads(r.read())
                    break
            except urllib.error.HTTPError as e:
                last = e.read().decode()
            except OSError as e:
                last = str(e)
            time.sleep(0.5)
        logs = podman("logs", cid, check=False)
        assert answer is not None, f"no 200 from the Sentinel in the container: {last}\n{logs.stdout}{logs.stderr}"
        assert answer["backlog"] == 5 and answer["desiredReplicas"] == 3
        user = podman("exec", cid, "/usr/local/bin/astro-sentinel", "--version", check=False)
        assert user.returncode == 0
        top = podman("top", cid, "user", "group", check=False).stdout
        print(f"resolved by {'DNS (resolv.conf)' if dns else '/etc/hosts only: port 53 was taken'}; top: {top}")
        assert "65532" in top
    finally:
        podman("rm", "--force", cid, check=False)
        fake.shutdown()
        if dns:
            dns.close()


# ---- the agent image ------------------------------------------------------------------------


def test_agent_image_user_and_entrypoint(agent_image):
    config = agent_image["Config"]
    # The official Airflow image's user: the tasks container's, so the socket and the logs
    # are shared by owner and group.
    assert config["User"] == "50000:0"
    assert config["Entrypoint"] == ["/usr/local/bin/astro-agent"]
    assert not config.get("Cmd")
    assert "39091/tcp" in config.get("ExposedPorts", {})


def test_agent_image_holds_only_the_binary(podman, agent_image, tmp_path):
    files = podman.exported_files(AGENT_IMAGE, tmp_path / "fs.tar")
    assert files == ["usr/local/bin/astro-agent"], files


def test_agent_container_runs_as_its_user_and_installs_itself(podman, agent_image, static_agent, tmp_path):
    version = podman("run", "--rm", AGENT_IMAGE, "--version").stdout
    assert version == subprocess.run([str(static_agent), "--version"], check=True, stdout=subprocess.PIPE,
                                     text=True).stdout
    # The worker Pod's init step: the binary into a volume the tasks container runs it from.
    # An emptyDir with the Pod's fsGroup 0: writable by group 0.
    volume = tmp_path / "bin"
    volume.mkdir()
    os.chown(volume, 0, 0)
    volume.chmod(0o2775)
    podman("run", "--rm", "-v", f"{volume}:/opt/astro-agent/bin", AGENT_IMAGE, "install", "/opt/astro-agent/bin")
    installed = volume / "astro-agent"
    st = installed.stat()
    assert stat.S_IMODE(st.st_mode) == 0o755
    assert st.st_uid == 50000, "not written by the image's user"
    assert installed.read_bytes() == static_agent.read_bytes()


@pytest.mark.parametrize("dockerfile, user", [("sentinel", "65532:65532"), ("agent", "50000:0")])
def test_dockerfiles_final_stage_is_the_binary_on_scratch(dockerfile, user):
    text = (REPO / f"docker/{dockerfile}/Dockerfile").read_text()
    final = text[text.rindex("\nFROM "):]
    assert final.startswith("\nFROM scratch\n")
    assert re.search(rf"^USER {user}$", final, re.M)
    assert "RUN " not in final
    assert re.search(r"crt-static", text)
    assert re.search(r"^ARG BINARY_FROM=build$", text, re.M)


def test_dockerignore_keeps_the_context_small():
    lines = (REPO / ".dockerignore").read_text().split()
    assert lines[lines.index("*")] == "*"
    for needed in (
        "!Cargo.toml", "!Cargo.lock", "!airflow/", "!http-server/", "!logging/", "!agent/", "!sentinel/", "!test-kit/"
    ):
        assert needed in lines
