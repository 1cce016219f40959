"""The tasks container's image, assembled from this machine's files: nothing can be pulled here.

It stands in for a user's own Airflow image, which the worker Pod runs unmodified: the Python
the tests run Airflow with, the Airflow venv the tests already build
(:func:`harness.airflow_stack.airflow_venv`) *without* the Edge provider (tasks must not need
it), the shared libraries those need, ``/etc/passwd`` with the official Airflow image's user
(uid 50000) and a world-writable ``/tmp``. No astro-agent: the Pod's init step copies the
binary in, as it would into any user's image.

Layout, as in the official image: Python in ``/usr/local`` (the shared ``libpython`` found
through an ``/etc/ld.so.cache`` made by ``ldconfig -r``, since the interpreter's RUNPATH names
where it was built), the venv in ``/opt/airflow/venv`` (first on ``PATH``, so ``python3`` is
the venv's), ``AIRFLOW_HOME=/opt/airflow`` owned by the user. Every other library keeps the
path ``ldd`` resolves it to on this machine, with the symbolic links on the way (``/lib64``,
``/lib``) reproduced.

The tarball is cached under ``$ASTRO_CACHE_DIR/tasks-image/``, keyed by what goes into it:
this file, the venv (its path holds the requirements' hash; its completion marker's time),
the interpreter, and the machine's installed packages (the libraries). A later run only
imports it (``podman import``, 10-18 s on 2 busy cores). Assembling it takes 5-9 s (a 430 MB
tar; the venv is the bulk of it), once the Airflow venv exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from harness.airflow_stack import airflow_venv

#: The official Airflow image's user (``airflow``) and group (root's, as OpenShift wants).
UID, GID = 50000, 0
USER = f"{UID}:{GID}"
PREFIX = "/usr/local"
AIRFLOW_HOME = "/opt/airflow"
VENV = f"{AIRFLOW_HOME}/venv"
#: ``podman import --change`` lines: what the official image sets that tasks rely on.
CONFIG = [
    f"USER {USER}",
    f"WORKDIR {AIRFLOW_HOME}",
    f"ENV PATH={VENV}/bin:{PREFIX}/bin:/usr/bin:/bin",
    f"ENV AIRFLOW_HOME={AIRFLOW_HOME}",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
]

# What a task never imports, and that would only make the image bigger.
STDLIB_SKIPPED = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"}
STDLIB_SKIPPED_PREFIXES = ("config-",)  # the static library and Makefile for building extensions
STDLIB_SKIPPED_MODULES = ("_tkinter",)  # tkinter's extension: it would bring X11's libraries


def _edge_provider(path: str) -> bool:
    """The Edge provider's package and its distribution metadata (the provider registry finds
    providers by their dist-info's entry point)."""
    return bool(re.search(r"/site-packages/(airflow/providers/edge3(/|$)|apache_airflow_providers_edge3-[^/]*\.dist-info(/|$))", path))


def _python_facts(venv: Path) -> dict:
    code = ("import json, os, sys, sysconfig; print(json.dumps({'base_prefix': sys.base_prefix, "
            "'version': '%d.%d' % sys.version_info[:2], 'full_version': sys.version.split()[0], "
            "'executable': os.path.realpath(sys.executable), 'ldlibrary': sysconfig.get_config_var('LDLIBRARY'), "
            "'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED'))}))")
    return json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True,
                                     stdout=subprocess.PIPE, text=True).stdout)


def _key(venv: Path, py: dict) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(str(venv).encode())
    h.update(str((venv / ".complete").stat().st_mtime_ns).encode())
    executable = Path(py["executable"])
    h.update(f"{executable}:{executable.stat().st_mtime_ns}:{py['full_version']}".encode())
    # The system libraries: any package installed, upgraded or removed changes this file.
    status = Path("/var/lib/dpkg/status")
    if status.exists():
        h.update(hashlib.sha256(status.read_bytes()).digest())
    return h.hexdigest()[:16]


def tarball(cache_dir: Path | None = None) -> tuple[Path, float | None]:
    """The image's root file system as a tar file, and the seconds spent assembling it (None
    when it came from the cache)."""
    cache_dir = Path(cache_dir or os.environ.get("ASTRO_CACHE_DIR") or Path.home() / ".cache" / "astro-agent")
    venv = airflow_venv()
    py = _python_facts(venv)
    folder = cache_dir / "tasks-image"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"tasks-{_key(venv, py)}.tar"
    # One assembly at a time: test sessions side by side share the cache.
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out, None
        started = time.monotonic()
        partial = out.with_suffix(".partial")
        try:
            _assemble(venv, py, partial)
            partial.rename(out)
        finally:
            partial.unlink(missing_ok=True)
        for old in folder.glob("tasks-*.tar"):  # an older key's tarball is never read again
            if old != out:
                old.unlink()
        return out, time.monotonic() - started


# ---- assembly -------------------------------------------------------------------------------


class _Tar:
    """A tar stream of root-owned files (unless said otherwise), each parent directory once."""

    def __init__(self, path: Path):
        self.tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT)
        self.dirs: set[str] = set()
        self.files: set[str] = set()

    def _info(self, name: str, kind: bytes, mode: int, uid: int = 0, gid: int = 0) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.type, info.mode, info.uid, info.gid, info.mtime = kind, mode, uid, gid, int(time.time())
        return info

    def dir(self, name: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        name = name.rstrip("/")
        if not name or name in self.dirs:
            return
        self.parents(name)
        self.dirs.add(name)
        self.tar.addfile(self._info(name, tarfile.DIRTYPE, mode, uid, gid))

    def parents(self, name: str) -> None:
        parent = os.path.dirname(name.rstrip("/"))
        if parent not in ("", "/"):
            self.dir(parent)

    def symlink(self, name: str, target: str) -> None:
        if name in self.dirs:
            return
        self.parents(name)
        self.dirs.add(name)  # so that the walk through it is not added as a directory
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.tar.addfile(info)

    def data(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.parents(name)
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def file(self, name: str, source: Path) -> None:
        """A host file (its mode, size and time: the venv's .pyc files check the latter two)."""
        if name in self.files:
            return
        self.files.add(name)
        self.parents(name)
        st = source.lstat()
        info = self._info(name, tarfile.REGTYPE, stat.S_IMODE(st.st_mode))
        info.size, info.mtime = st.st_size, int(st.st_mtime)
        with open(source, "rb") as f:
            self.tar.addfile(info, f)

    def tree(self, name: str, source: Path, skip=lambda path: False, rewrite=None) -> None:
        """A host folder, recursively; symbolic links stay links; ``rewrite(path, data)`` may
        replace a file's contents."""
        for dirpath, dirnames, filenames in os.walk(source):
            rel = os.path.relpath(dirpath, source)
            here = name if rel == "." else f"{name}/{rel}"
            dirnames[:] = [d for d in dirnames if not skip(os.path.join(dirpath, d))]
            self.dir(here, stat.S_IMODE(os.lstat(dirpath).st_mode))
            for entry in [*dirnames, *filenames]:
                path = Path(dirpath, entry)
                if skip(str(path)):
                    continue
                if path.is_symlink():
                    self.symlink(f"{here}/{entry}", os.readlink(path))
                    if entry in dirnames:
                        dirnames.remove(entry)
                elif entry in filenames:
                    data = rewrite(path) if rewrite else None
                    if data is None:
                        self.file(f"{here}/{entry}", path)
                    else:
                        self.data(f"{here}/{entry}", data, stat.S_IMODE(path.stat().st_mode))

    def close(self) -> None:
        self.tar.close()


def _host_path(tar: _Tar, path: str) -> None:
    """A host file at the same path, with every symbolic link on the way reproduced (``/lib64``
    -> ``usr/lib64``, ``libc.so.6`` -> ...), so that the path the dynamic loader asks for works."""
    seen = 0
    while True:
        seen += 1
        assert seen < 40, f"too many symbolic links resolving {path}"
        parts = Path(path).parts
        for i in range(2, len(parts) + 1):
            prefix = str(Path(*parts[:i]))
            if os.path.islink(prefix):
                target = os.readlink(prefix)
                tar.symlink(prefix, target)
                path = os.path.normpath(os.path.join(os.path.dirname(prefix), target, *parts[i:]))
                break
        else:
            tar.file(path, Path(path))
            return


_LDD_LINE = re.compile(r"^\s*(?:(\S+) => )?(\S+) \(0x[0-9a-f]+\)$")


def _libraries(elf_files: list[Path]) -> tuple[set[str], set[str]]:
    """The shared libraries ``ldd`` resolves for the files, and the names it could not find."""
    found, missing = set(), set()
    for chunk in range(0, len(elf_files), 200):
        out = subprocess.run(["ldd", *map(str, elf_files[chunk:chunk + 200])], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout
        for line in out.splitlines():
            if line.strip().endswith("=> not found"):
                missing.add(line.split()[0])
                continue
            m = _LDD_LINE.match(line)
            if m and m.group(2).startswith("/"):
                found.add(m.group(2))
    return found, missing


def _libgcc_s() -> list[str]:
    """glibc loads libgcc_s at run time (thread cancellation, backtraces): ldd never lists it."""
    out = subprocess.run(["ldconfig", "-p"], stdout=subprocess.PIPE, text=True).stdout
    return [line.split(" => ")[1] for line in out.splitlines()
            if line.strip().startswith("libgcc_s.so.1 ") and "x86-64" in line][:1]


def _assemble(venv: Path, py: dict, out: Path) -> None:
    base, version = Path(py["base_prefix"]), py["version"]
    stdlib = base / "lib" / f"python{version}"
    tar = _Tar(out)
    try:
        for name, mode, uid in (("/tmp", 0o1777, 0), ("/etc", 0o755, 0), ("/home/airflow", 0o755, UID),
                                (AIRFLOW_HOME, 0o775, UID)):
            tar.dir(name, mode, uid, GID if uid else 0)
        tar.data("/etc/passwd", b"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                 b"airflow:x:50000:0:airflow:/home/airflow:/usr/sbin/nologin\n")
        tar.data("/etc/group", b"root:x:0:\n")

        # The interpreter and its standard library, moved to /usr/local.
        interpreter = f"{PREFIX}/bin/python{version}"
        tar.file(interpreter, Path(py["executable"]))
        for alias in ("python3", "python"):
            tar.symlink(f"{PREFIX}/bin/{alias}", f"python{version}")

        def stdlib_skip(path: str) -> bool:
            rel = os.path.relpath(path, stdlib).split(os.sep)
            return (rel[0] in STDLIB_SKIPPED or rel[0].startswith(STDLIB_SKIPPED_PREFIXES)
                    or rel[0] == "lib-dynload" and rel[-1].startswith(STDLIB_SKIPPED_MODULES))

        tar.tree(f"{PREFIX}/lib/python{version}", stdlib, skip=stdlib_skip)

        # The venv, minus the Edge provider, pointed at the moved interpreter.
        host_shebang = f"#!{venv}/bin/".encode()

        def venv_skip(path: str) -> bool:
            replaced = {str(venv / name) for name in
                        ("pyvenv.cfg", ".complete", "bin/python", "bin/python3", f"bin/python{version}")}
            return _edge_provider(path) or path in replaced

        def shebang(path: Path) -> bytes | None:
            if path.parent != venv / "bin":
                return None
            data = path.read_bytes()
            if not data.startswith(host_shebang):
                return None
            return f"#!{VENV}/bin/".encode() + data[len(host_shebang):]

        tar.tree(VENV, venv, skip=venv_skip, rewrite=shebang)
        for alias in ("python", "python3", f"python{version}"):
            tar.symlink(f"{VENV}/bin/{alias}", interpreter)
        tar.data(f"{VENV}/pyvenv.cfg", f"home = {PREFIX}/bin\ninclude-system-site-packages = false\n"
                 f"version = {py['full_version']}\nexecutable = {interpreter}\n".encode())

        # The shared libraries of the interpreter and of every extension module. libpython goes
        # to /usr/local/lib (found through the cache ldconfig makes below); the rest keep their
        # host paths.
        elf = [Path(py["executable"])]
        elf += [p for p in (stdlib / "lib-dynload").glob("*.so") if not stdlib_skip(str(p))]
        elf += [p for p in venv.rglob("*.so*") if p.is_file() and not _edge_provider(str(p))]
        libraries, missing = _libraries(elf)
        if missing:
            print(f"tasks image: libraries ldd did not find (their modules fail on the host too): {sorted(missing)}")
        own = str(base / "lib") + "/"
        staging = Path(tempfile.mkdtemp(prefix="tasks-image-ld-"))
        try:
            for lib in sorted(libraries) + _libgcc_s():
                if lib.startswith(str(venv) + "/"):
                    continue  # in the venv already (a wheel's bundled libraries)
                if lib.startswith(own):
                    real = Path(lib).resolve()
                    tar.file(f"{PREFIX}/lib/{real.name}", real)
                    if Path(lib).name != real.name:
                        tar.symlink(f"{PREFIX}/lib/{Path(lib).name}", real.name)
                    shutil.copy2(real, staging / real.name)
                else:
                    _host_path(tar, lib)
            # ldconfig -r: the cache as the image sees it, made from the moved libpython only (the
            # loader's default folders find the others).
            (staging / "etc").mkdir()
            (staging / "etc" / "ld.so.conf").write_text(f"{PREFIX}/lib\n")
            (staging / PREFIX.lstrip("/")).mkdir(parents=True)
            libdir = staging / PREFIX.lstrip("/") / "lib"
            libdir.mkdir()
            for so in staging.glob("lib*.so*"):
                so.rename(libdir / so.name)
            subprocess.run(["ldconfig", "-r", str(staging)], check=True)
            tar.data("/etc/ld.so.conf", (staging / "etc" / "ld.so.conf").read_bytes())
            tar.data("/etc/ld.so.cache", (staging / "etc" / "ld.so.cache").read_bytes())
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        tar.close()


if __name__ == "__main__":  # assemble (or find) the tarball: python tests/docker/tasks_image.py
    path, seconds = tarball()
    print(path, f"assembled in {seconds:.1f}s" if seconds is not None else "(cached)", file=sys.stderr)
