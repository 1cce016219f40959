"""The container images in docker/, as far as a machine without a registry allows.

Sentinel (built for real): the static astro-sentinel (glibc, ``+crt-static``) every stage runs —
``$ASTRO_SENTINEL_BIN`` from the test command's one release build (tests/lib/cargo-target.sh), else
built here with the same flags — then ``podman build`` runs docker/sentinel/Dockerfile with
``--build-arg BINARY_FROM=context`` (nothing is pulled: every stage it builds is ``FROM
scratch``). Checks: user ``65532:65532``, entrypoint ``/usr/local/bin/astro-sentinel``, no
command, the image holds the one binary (no shell); then the container runs on the host network
against an in-test fake of Airflow's REST API reached by a host name (``/etc/hosts``, glibc's
built-in ``files`` module) and by a name that only an in-test DNS server on 127.0.0.1:53
knows (``/etc/resolv.conf``, the built-in ``dns`` module), and serves the backlog.

Agent (not buildable here: its bases, the Rust image and apache/airflow, cannot be pulled):
the Dockerfile is checked statically — bases pinned by exact version, the Airflow and edge3
versions equal to the ones the end-to-end tests run, numeric non-root user, dumb-init as PID 1
with ``--single-child`` in front of the agent.

podman is installed with apt when missing (root). Images and containers live in a temp podman
storage (``--root``) that is removed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tarfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOKEN = "docker-test-token"
IMAGE = "localhost/astro-sentinel:test"


# ---- podman ---------------------------------------------------------------------------------


def ensure_podman() -> str:
    """podman, and runc: crun refuses hosts with cgroups in hybrid (v1 + v2) mode."""
    missing = [p for p in ("podman", "runc") if not shutil.which(p)]
    if missing:
        if os.geteuid() != 0:
            pytest.fail(f"missing {missing} and this is not root: apt-get install -y {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    path = shutil.which("podman")
    assert path and shutil.which("runc"), "podman or runc still missing after apt-get install"
    return path


def run_limits() -> list[str]:
    """``podman run`` sets RLIMIT_NOFILE/NPROC above ours by default, which an unprivileged
    sandbox refuses; ask for what we have (processes: plenty for one server)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", "nproc=4096:4096"]


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    binary = ensure_podman()
    store = tmp_path_factory.mktemp("podman")
    base = [binary, "--root", str(store / "root"), "--runroot", str(store / "run"),
            "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
            "--runtime", shutil.which("runc")]

    def run(*args, check=True, timeout=600, **kw) -> subprocess.CompletedProcess:
        result = subprocess.run([*base, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, timeout=timeout, **kw)
        if check and result.returncode != 0:
            pytest.fail(f"podman {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    yield run
    run("rm", "--all", "--force", check=False)
    run("rmi", "--all", "--force", check=False)
    subprocess.run(["chmod", "-R", "u+rwX", str(store)], check=False)
    shutil.rmtree(store, ignore_errors=True)


# ---- the static binary ----------------------------------------------------------------------


def has_interpreter(path: Path) -> bool:
    """True when the ELF file has a PT_INTERP program header (it needs a dynamic loader)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path} is not a 64-bit ELF file"
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return any(struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 3 for i in range(phnum))


@pytest.fixture(scope="module")
def static_sentinel() -> Path:
    given = os.environ.get("ASTRO_SENTINEL_BIN")
    if given:
        return Path(given)
    built = subprocess.run(["bash", "-c", ". tests/lib/cache.sh && . tests/lib/cargo-target.sh && "
                            "cargo build --release --locked -p astro-sentinel >&2 && "
                            'echo "$ASTRO_RELEASE_DIR/astro-sentinel"'],
                           cwd=REPO, check=True, stdout=subprocess.PIPE, text=True, timeout=3600)
    return Path(built.stdout.strip())


def test_the_sentinel_binary_is_static(static_sentinel):
    assert not has_interpreter(static_sentinel), "needs a dynamic loader: not usable FROM scratch"
    out = subprocess.run([str(static_sentinel), "--version"], check=True, stdout=subprocess.PIPE, text=True).stdout
    assert out.startswith("astro-sentinel ")


# ---- the Sentinel image ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel_image(podman, static_sentinel, tmp_path_factory) -> dict:
    context = tmp_path_factory.mktemp("sentinel-context")
    shutil.copy2(static_sentinel, context / "astro-sentinel")
    podman("build", "--build-arg", "BINARY_FROM=context", "-f", str(REPO / "docker/sentinel/Dockerfile"),
           "-t", IMAGE, str(context), timeout=900)
    return json.loads(podman("image", "inspect", IMAGE).stdout)[0]


def test_sentinel_image_user_and_entrypoint(sentinel_image):
    config = sentinel_image["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["/usr/local/bin/astro-sentinel"]
    assert not config.get("Cmd")
    assert "39092/tcp" in config.get("ExposedPorts", {})


def test_sentinel_image_holds_only_the_binary(podman, sentinel_image, tmp_path):
    cid = podman("create", IMAGE).stdout.strip()
    try:
        podman("export", "-o", str(tmp_path / "fs.tar"), cid)
    finally:
        podman("rm", cid, check=False)
    with tarfile.open(tmp_path / "fs.tar") as tar:
        files = sorted(m.name.lstrip("./") for m in tar.getmembers() if not m.isdir())
    # The runtime may leave empty mount points for /etc/hosts and /etc/resolv.conf.
    files = [f for f in files if f not in ("etc/hosts", "etc/resolv.conf", "etc/hostname", "run/.containerenv")]
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
    cid = podman("run", "-d", "--network", "host", *run_limits(), "-v", f"{tmp_path}:/config:ro", *extra,
                 "-e", f"ASTRO_SENTINEL_AIRFLOW_TOKEN={TOKEN}", IMAGE,
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


# ---- the agent's Dockerfile (static checks only) --------------------------------------------


def test_agent_dockerfile_matches_what_the_tests_run():
    text = (REPO / "docker/agent/Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    reqs = (REPO / "tests/requirements-airflow.txt").read_text()
    airflow = re.search(r"^apache-airflow==(\S+)$", reqs, re.M).group(1)
    edge = re.search(r"^apache-airflow-providers-edge3==(\S+)$", reqs, re.M).group(1)
    assert re.fullmatch(rf"docker\.io/apache/airflow:{re.escape(airflow)}-python3\.\d+", args["AIRFLOW_IMAGE"])
    assert args["EDGE_PROVIDER_VERSION"] == edge
    assert re.fullmatch(r"docker\.io/library/rust:\d+\.\d+\.\d+-slim-\w+", args["RUST_IMAGE"])
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages == ["${RUST_IMAGE}", "${AIRFLOW_IMAGE}"]
    final = text[text.rindex("\nFROM "):]
    users = re.findall(r"^USER (\S+)$", final, re.M)
    assert users and users[-1] == "50000:0"
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", final, re.M).group(1))
    assert entry == ["/usr/bin/dumb-init", "--single-child", "--", "/usr/local/bin/astro-agent"]
    assert "COPY --from=build /out/astro-agent /usr/local/bin/astro-agent" in final
    assert re.search(r"^CMD \[\]$", final, re.M)


def test_sentinel_dockerfile_final_stage():
    text = (REPO / "docker/sentinel/Dockerfile").read_text()
    final = text[text.rindex("\nFROM "):]
    assert final.startswith("\nFROM scratch\n")
    assert re.search(r"^USER 65532:65532$", final, re.M)
    assert "RUN " not in final
    assert re.search(r"crt-static", text)


def test_dockerignore_keeps_the_context_small():
    lines = (REPO / ".dockerignore").read_text().split()
    assert lines[lines.index("*")] == "*"
    for needed in (
        "!Cargo.toml", "!Cargo.lock", "!airflow/", "!http-server/", "!logging/", "!agent/", "!sentinel/", "!test-kit/"
    ):
        assert needed in lines
