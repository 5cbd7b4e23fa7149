"""The processes a call may have left behind, as the zygote sees them in /proc (its own pid
namespace when jailed). Kept apart from the zygote's serving loop: this is only read when a call
ends in a way that may have left something running."""
from __future__ import annotations

import os


def processes(skip_uids: frozenset = frozenset(), skip_pids: frozenset = frozenset()):
    """(pid, uid, ppid, state) of visible processes, skipping those owned by `skip_uids`.

    /proc/<pid> is owned by the process's uid when it is dumpable; processes that changed uid
    are not, and show as root, so root-owned entries have their real uid read from
    /proc/<pid>/status.
    """
    for name in os.listdir("/proc"):
        if not name.isdigit() or name in skip_pids:
            continue
        try:
            uid = os.stat(f"/proc/{name}").st_uid
            if uid in skip_uids:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if uid == 0:
                with open(f"/proc/{name}/status", "rb") as f:
                    uid = int(next(line for line in f if line.startswith(b"Uid:")).split()[1])
        except (OSError, StopIteration, IndexError, ValueError):
            continue
        yield int(name), uid, int(fields[1]), fields[0].decode()


def descends(pid: int, ancestor: int) -> bool:
    for _ in range(4096):
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
