"""How a zygote is confined: pick a backend and build the command that starts it.

The jail is set up ONCE per worker (the zygote process itself runs inside it) and every call is a
fork inside that jail, so the per-call cost is a fork, not a bwrap start (+3-15 ms per call).

Backends, in the order "auto" tries them:
  * bwrap       -- bubblewrap: new net/pid/ipc/uts namespaces, read-only binds of only what Python
                   needs (/usr, /lib*, a few /etc files, the Python prefixes, this package at
                   /opt/rstar2), a size-capped tmpfs /tmp holding the scratch dirs, cleared env.
                   As root it keeps just the capabilities needed to drop each call to its own
                   unprivileged uid; as non-root it adds a user namespace and calls run one at a
                   time under the mapped uid.
  * namespaces  -- no bwrap: the zygote unshares net/ipc/uts itself (needs root); per-call uids
                   and rlimits still apply, but the filesystem is the host's (protected only by
                   file permissions) and there is no pid namespace.
  * none        -- nothing but rlimits and (as root) per-call uids; only with unsafe_no_isolation.
  * nsjail      -- not implemented in this build: requesting it raises SandboxUnavailable.
"""
from __future__ import annotations

import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
JAIL_PACKAGE_ROOT = "/opt/rstar2"
JAIL_SCRATCH = "/tmp/rstar2-scratch"
TMPFS_BYTES = 512 * 1024 * 1024
BACKENDS = ("auto", "nsjail", "bwrap", "namespaces", "none")
_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be provided on this machine."""


@dataclass
class JailPlan:
    backend: str
    per_call_uid: bool  # True: each slot runs as its own unprivileged uid
    slots: int  # concurrent children per zygote
    uid_base: int | None
    _tmpdirs: list[str] = field(default_factory=list)

    def command(self, worker: int, preload: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
        """argv and environment that start zygote number `worker`."""
        uid_base = None if self.uid_base is None else self.uid_base + worker * self.slots
        if self.backend == "bwrap":
            scratch, pkg_root = f"{JAIL_SCRATCH}", JAIL_PACKAGE_ROOT
        else:
            scratch = tempfile.mkdtemp(prefix="rstar2-sbx-")
            os.chmod(scratch, 0o711)
            self._tmpdirs.append(scratch)
            pkg_root = str(PACKAGE_DIR.parent)
        config = {"slots": self.slots, "uid_base": uid_base, "scratch_root": scratch,
                  "preload": list(preload), "unshare_net": self.backend == "namespaces",
                  "own_pid_ns": self.backend == "bwrap"}
        boot = (f"import sys; sys.path.insert(0, {pkg_root!r}); "
                "from sandbox.zygote import main; main()")
        python = [sys.executable, "-I", "-c", boot, json.dumps(config)]
        if self.backend == "bwrap":
            return _bwrap_prefix(self.per_call_uid) + python, {}
        return python, dict(_ENV)

    def cleanup(self) -> None:
        for path in self._tmpdirs:
            shutil.rmtree(path, ignore_errors=True)
        self._tmpdirs.clear()


def plan(isolation: str, unsafe_no_isolation: bool, workers: int, slots: int | None) -> JailPlan:
    if isolation not in BACKENDS:
        raise ValueError(f"isolation: {isolation!r} is not one of {', '.join(BACKENDS)}")
    backend = _choose(isolation, unsafe_no_isolation)
    # outside bwrap, unprivileged uids must be able to read Python and this package in place
    per_call_uid = os.geteuid() == 0 and (backend == "bwrap" or _unreadable_by_others() is None)
    slots = (slots or 8) if per_call_uid else 1
    uid_base = random.SystemRandom().randrange(1_000_000, 2_000_000_000) if per_call_uid else None
    return JailPlan(backend=backend, per_call_uid=per_call_uid, slots=slots, uid_base=uid_base)


def _choose(isolation: str, unsafe: bool) -> str:
    if isolation == "nsjail":
        raise SandboxUnavailable("isolation='nsjail': the nsjail backend is not implemented in this build; "
                                 "use 'bwrap' (bubblewrap) or 'auto'")
    if isolation in ("auto", "bwrap"):
        problem = bwrap_problem()
        if problem is None:
            return "bwrap"
        if isolation == "bwrap":
            raise SandboxUnavailable(f"isolation='bwrap': {problem}")
    if isolation in ("auto", "namespaces"):
        problem = namespaces_problem()
        if problem is None:
            return "namespaces"
        if isolation == "namespaces":
            raise SandboxUnavailable(f"isolation='namespaces': {problem}")
    if not unsafe:
        raise SandboxUnavailable("no isolation backend available (install bubblewrap, or run as root for "
                                 "namespaces); pass unsafe_no_isolation=True to run code unconfined")
    return "none"


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap can start a sandbox here, else why not."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap (bubblewrap) is not on PATH"
    argv = [exe, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--proc", "/proc", "--dev", "/dev"]
    if os.geteuid() != 0:
        argv.append("--unshare-user")
    proc = subprocess.run(argv + ["true"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return f"bwrap cannot create namespaces here: {proc.stderr.strip() or proc.returncode}"
    return None


@functools.cache
def namespaces_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root to unshare the network namespace without bubblewrap"
    unreadable = _unreadable_by_others()
    if unreadable:
        return f"{unreadable} is not readable by unprivileged users, so calls could not drop root"
    code = ("import ctypes; l = ctypes.CDLL(None, use_errno=True); "
            "raise SystemExit(0 if l.unshare(0x40000000) == 0 else ctypes.get_errno())")
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, timeout=30)
    return None if proc.returncode == 0 else f"unshare(CLONE_NEWNET) failed (errno {proc.returncode})"


def _unreadable_by_others() -> str | None:
    """The first directory on the way to Python or this package that other users cannot enter."""
    for target in [*_python_roots(), str(PACKAGE_DIR)]:
        for path in [*reversed(Path(target).parents), Path(target)]:
            if not os.stat(path).st_mode & 0o001:
                return str(path)
    return None


def _python_roots() -> list[str]:
    """Directories the interpreter and its site-packages live in (bound read-only)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(sys.executable).resolve().parent.parent)}
    return sorted(r for r in roots if os.path.isdir(r) and not r.startswith("/usr"))


def _bwrap_prefix(per_call_uid: bool) -> list[str]:
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox", "--clearenv"]
    if per_call_uid:
        for cap in _CAPS:
            argv += ["--cap-add", cap]
    else:
        argv += ["--unshare-user"]
    for key, value in _ENV.items():
        argv += ["--setenv", key, value]
    argv += ["--size", str(TMPFS_BYTES), "--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in _ETC:
        argv += ["--ro-bind-try", path, path]
    roots = _python_roots()
    made = {"/", "/tmp", "/usr"}
    for root in roots:  # parents such as /root must be traversable (not listable) by call uids
        for parent in reversed(Path(root).parents):
            if str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0711", "--dir", str(parent)]
    for root in roots:
        argv += ["--ro-bind", root, root]
    argv += ["--ro-bind", str(PACKAGE_DIR), f"{JAIL_PACKAGE_ROOT}/sandbox",
             "--proc", "/proc", "--dev", "/dev", "--chdir", "/", "--"]
    return argv
