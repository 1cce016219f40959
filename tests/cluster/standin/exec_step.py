"""The step between ``unshare`` and a container's command, run as its own small program
(``python -I -S exec_step.py STATUS_FD``, standard library only, nothing of the stand-in loaded)
inside the container's new mount and UTS namespaces: bind-mount the volumes, set the hostname
and execve the command, so that the PID stays the one the stand-in signals.

It reads its spec on stdin (JSON: ``mounts``, ``hostname``, ``cwd``, ``argv``, ``env``), then puts
/dev/null there. On STATUS_FD (close-on-exec) it writes ``mntns INODE`` once in its mount
namespace and ``error TEXT`` if anything fails: EOF after the first line means the command runs.
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
from typing import NoReturn

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MNT_DETACH, PR_SET_PDEATHSIG = 1, 32, 4096, 16384, 2, 1


def exec_step(status_fd: int) -> NoReturn:
    os.set_inheritable(status_fd, False)
    status = os.fdopen(status_fd, "w", buffering=1)
    try:
        spec = json.loads(sys.stdin.buffer.read())
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
        libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
        libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)

        def check(rc: int, what: str) -> None:
            if rc != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"{what}: {os.strerror(err)}")

        # Die with the stand-in's thread that started us, even when it is killed without notice.
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        status.write(f"mntns {os.stat('/proc/self/ns/mnt').st_ino}\n")
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
            check(libc.mount(m["source"].encode(), target.encode(), None, MS_BIND | MS_REC, None),
                  f"mount {m['source']} at {target}")
            if m["readOnly"]:
                check(libc.mount(None, target.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None),
                      f"remount {target} read-only")
        socket.sethostname(spec["hostname"])
        os.makedirs(spec["cwd"], exist_ok=True)
        os.chdir(spec["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        argv, env = spec["argv"], spec["env"]
        path = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", DEFAULT_PATH))
        if path is None:
            raise OSError(errno.ENOENT, f'exec: "{argv[0]}": executable file not found in $PATH')
        os.execve(path, argv, env)
    except Exception as e:  # noqa: BLE001 - every failure becomes the container's StartError
        status.write(f"error {e}\n")
        os._exit(128)


if __name__ == "__main__":
    exec_step(int(sys.argv[1]))
