"""A container's shim and its first step inside its namespaces, run as a small program of its own
(``python -I -S exec_step.py STATUS_FD``, standard library only, nothing of the stand-in loaded) in
the Pod's network namespace.

The shim -- the process the stand-in started and reaps -- unshares a mount, a UTS and a PID
namespace and forks the container's init, PID 1 of the new PID namespace. The init mounts the
volumes, a /proc of its own PID namespace and an empty, read-only folder over the stand-in's Pod
folders, sets the hostname and execs the command: the command is PID 1, as in a real container.
The shim waits for it and exits with its status (128+N when signal N ended it). The kernel ends
every other process of a PID namespace when its init ends, before the init's parent can reap it,
so once the shim has exited nothing of the container runs any more.

The spec comes on stdin (JSON: ``mounts``, ``hidden``, ``hostname``, ``cwd``, ``argv``, ``env``);
stdin then becomes /dev/null. On STATUS_FD (close-on-exec) the shim writes ``init PID`` (the init's
PID as the stand-in sees it) and either of them ``error TEXT`` when something fails: EOF after
``init`` without an error means the command runs.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import sys
from typing import NoReturn, TextIO

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWPID = 0x00020000, 0x04000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH, PR_SET_PDEATHSIG = 2, 1
START_FAILED = 128  # what a runtime reports for a container whose command never ran

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
libc.unshare.argtypes = (ctypes.c_int,)


def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                     flags, data.encode() if data else None), f"mount {source or fstype} at {target}")


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it ends, even when that is killed without
    notice: the shim dies with the stand-in's pod worker, the init with the shim."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def shim(status_fd: int) -> NoReturn:
    os.set_inheritable(status_fd, False)
    status = os.fdopen(status_fd, "w", buffering=1)
    try:
        die_with_parent()
        spec = json.loads(sys.stdin.buffer.read())
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # Mount and UTS namespaces apply to the shim at once, the PID namespace to its next child.
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
        pid = os.fork()
    except Exception as e:  # noqa: BLE001 - every failure becomes the container's StartError
        status.write(f"error {e}\n")
        os._exit(START_FAILED)
    if pid == 0:
        init(spec, status)
    status.write(f"init {pid}\n")
    status.close()
    _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    os._exit(code if code >= 0 else 128 - code)


def init(spec: dict, status: TextIO) -> NoReturn:
    """PID 1 of the container: set up its mount namespace and exec the command."""
    try:
        die_with_parent()
        # Nothing mounted here propagates back to the host, nor the other way.
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        # Our copies of the other Pods' netns mounts would keep those namespaces alive after the
        # node deletes them.
        if os.path.ismount("/run/netns"):
            check(libc.umount2(b"/run/netns", MNT_DETACH), "umount /run/netns")
        for m in spec["mounts"]:
            target = m["target"]
            if not os.path.lexists(target):
                if m["file"]:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    open(target, "a").close()
                else:
                    os.makedirs(target)
            mount(m["source"], target, None, MS_BIND | MS_REC)
            if m["readOnly"]:
                mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        # After the volumes, whose sources live there: the other containers' volumes and the Pods'
        # files are out of sight under their host-side paths.
        for path in spec["hidden"]:
            if os.path.isdir(path):
                mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
        # The kernel's view of processes (/proc) follows the PID namespace of whoever mounts it.
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        socket.sethostname(spec["hostname"])
        os.makedirs(spec["cwd"], exist_ok=True)
        os.chdir(spec["cwd"])
        argv, env = spec["argv"], spec["env"]
        path = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", DEFAULT_PATH))
        if path is None:
            raise OSError(errno.ENOENT, f'exec: "{argv[0]}": executable file not found in $PATH')
        os.execve(path, argv, env)
    except Exception as e:  # noqa: BLE001 - every failure becomes the container's StartError
        status.write(f"error {e}\n")
        os._exit(START_FAILED)


if __name__ == "__main__":
    shim(int(sys.argv[1]))
