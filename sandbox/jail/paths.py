"""Which host folders a jailed zygote sees, and which it must not.

Seen, read-only (sandbox.jail.backends binds them at the same paths):
  * the system folders (/usr, /bin, /lib*, a few /etc files) and the interpreter's prefixes
    (python_roots: its standard library and site-packages);
  * every other folder on the host's sys.path: a PYTHONPATH folder, a .pth line, the user site,
    a `pip install --target` folder. The jailed interpreter runs with `-I`, which ignores
    PYTHONPATH and the user site, so the zygote takes the host's import path from its config
    (JailPaths.sys_path, in the host's order; sandbox.inside.zygote.main). Whatever the host
    imports, the full tier imports, wherever it is installed.
Hidden: the project, i.e. the host's working folder and the source checkout the sandbox package
was imported from (PACKAGE_DIR's parent, when it holds pyproject.toml, setup.py or .git; an
installed package's parent is a site-packages folder, which is seen). A sys.path entry inside
the project is not bound: the jailed code needs nothing of it (the sandbox package itself is
bound at JAIL_PACKAGE_ROOT), except an interpreter prefix (a `.venv` inside the checkout) or a
site-packages folder (the user site under a home you run from). An entry that holds the project,
or one of the jail's own mount points, cannot be bound without showing or covering them:
JailPaths.problem names it, and a jailed pool refuses to start; so does a module the zygote
preloads that the host finds in the hidden project (hidden_module_problem).
"""
from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the sandbox package: the jail binds it for the zygote
JAIL_PACKAGE_ROOT = "/opt/rstar2"
JAIL_SCRATCH = "/tmp/rstar2-scratch"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
# The jail's own mounts: a bind must neither hold them nor sit inside them (/tmp is a tmpfs that
# binds may sit in: its scratch folder is JAIL_SCRATCH).
_RESERVED = ("/proc", "/dev", JAIL_PACKAGE_ROOT, JAIL_SCRATCH)
_CHECKOUT_MARKERS = ("pyproject.toml", "setup.py", ".git")
_INSTALL_DIRS = ("site-packages", "dist-packages")  # installed packages, shown even inside the project


@dataclass(frozen=True)
class JailPaths:
    sys_path: tuple[str, ...]  # the full tier's import path (after JAIL_PACKAGE_ROOT), host order
    binds: tuple[str, ...]  # read-only binds beyond the system folders: outermost only, sorted
    project: tuple[str, ...]  # folders the jail hides
    problem: str | None = None  # a sys.path entry that cannot be bound, named, in one line

    def mount_points(self) -> list[str]:
        """Every path the jail mounts or creates (what a jailed listing of a parent folder shows)."""
        return [*self.binds, *SYSTEM_DIRS, "/etc", "/proc", "/dev", "/tmp", JAIL_SCRATCH, JAIL_PACKAGE_ROOT]

    def shown_names(self, folder: str) -> list[str]:
        """The entries of `folder` that the jail shows by design: the first path component under it
        of every mount point strictly inside it (the `.venv` of a checkout, `.pyenv` in a home)."""
        prefix = folder.rstrip("/") + "/"
        return sorted({m[len(prefix):].split("/", 1)[0] for m in self.mount_points() if m.startswith(prefix)})


def inside(path: str, folder: str) -> bool:
    """`path` is `folder` or lies under it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def python_roots() -> list[str]:
    """Directories the interpreter and its site-packages live in (bound read-only)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(sys.executable).resolve().parent.parent)}
    return sorted(r for r in roots if os.path.isdir(r) and not r.startswith("/usr"))


def project_dirs() -> list[str]:
    """The folders the jail hides: the working folder (unless it is /) and the source checkout the
    sandbox package comes from."""
    found = []
    cwd = os.path.realpath(os.getcwd())
    if cwd != "/":
        found.append(cwd)
    checkout = str(PACKAGE_DIR.parent)
    if any((PACKAGE_DIR.parent / marker).exists() for marker in _CHECKOUT_MARKERS) and checkout not in found:
        found.append(checkout)
    return found


def jail_paths() -> JailPaths:
    """The jail's view of the host's import path, from sys.path now (see the module doc)."""
    roots, project = python_roots(), project_dirs()
    seen = [*roots, *SYSTEM_DIRS]
    sys_path: list[str] = []
    extra: list[str] = []
    problem = None
    for entry in sys.path:
        path = os.path.abspath(entry or os.getcwd())
        if not os.path.exists(path):  # a zip that is not there, a path hook's name
            continue
        real = os.path.realpath(path)
        if any(inside(path, s) for s in seen) or any(inside(real, s) for s in seen):
            shown = path if any(inside(path, s) for s in seen) else real
        elif any(inside(real, p) for p in project) and os.path.basename(real) not in _INSTALL_DIRS:
            continue
        else:
            why = _bind_problem(entry, real, project)
            if why:
                problem = problem or why
                continue
            shown = real
            extra.append(real)
        if shown not in sys_path:
            sys_path.append(shown)
    return JailPaths(sys_path=tuple(sys_path), binds=tuple(outermost([*roots, *extra])),
                     project=tuple(project), problem=problem)


def hidden_module_problem(paths: JailPaths, modules: tuple[str, ...]) -> str | None:
    """One line naming the first of `modules` (what the zygote preloads) that the host imports from
    a folder the jail does not show, or None."""
    import importlib.util

    shown = [*paths.binds, *SYSTEM_DIRS]
    for name in dict.fromkeys(m.split(".")[0] for m in modules):
        spec = importlib.util.find_spec(name)
        where = (list(spec.submodule_search_locations or []) or [spec.origin]) if spec else []
        where = [os.path.realpath(w) for w in where if w and os.path.isabs(w)]
        if where and not any(inside(w, s) or inside(w, os.path.realpath(s)) for w in where for s in shown):
            return (f"preload module {name!r} is imported from {where[0]}, which the jail does not show (it shows "
                    f"the folders on sys.path outside the project: {', '.join(paths.project)}); install it there")
    return None


def _bind_problem(entry: str, real: str, project: list[str]) -> str | None:
    """Why the sys.path entry at `real` cannot be bound (one line), or None."""
    held = [p for p in project if inside(p, real)]
    if held:
        return (f"sys.path entry {entry!r} cannot be bound into the jail: it holds {held[0]}, a project folder "
                "the jail hides (take it off PYTHONPATH / sys.path, or run from another folder)")
    clash = [r for r in _RESERVED if inside(r, real) or inside(real, r)]
    if clash:
        return (f"sys.path entry {entry!r} cannot be bound into the jail: it covers or lies in {clash[0]}, "
                "where the jail mounts its own (take it off PYTHONPATH / sys.path)")
    return None


def outermost(paths: list[str]) -> list[str]:
    """The paths that lie in no other of them, sorted (binding those binds all)."""
    unique = sorted(set(paths))
    return [p for p in unique if not any(inside(p, q) and p != q for q in unique)]


def full_tier_paths(paths: JailPaths) -> list[str]:
    """Where the full tier finds modules that a light (`-S`) interpreter cannot: its import path
    less the standard library."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    std = {stdlib, os.path.join(stdlib, "lib-dynload"), os.path.realpath(sysconfig.get_paths()["platstdlib"])}
    return [p for p in paths.sys_path if os.path.realpath(p) not in std]


def traversable_parents(binds: list[str]) -> list[str]:
    """Parents of the binds (such as /root) that the jail must recreate so call uids can traverse
    (not list) them; in creation order."""
    made, parents = {"/", "/tmp", "/usr"}, []
    for bind in binds:
        for parent in map(str, reversed(Path(bind).parents)):
            if parent not in made:
                made.add(parent)
                parents.append(parent)
    return parents


def colon_path_problem(paths: JailPaths) -> str | None:
    for path in [*paths.binds, str(PACKAGE_DIR)]:
        if ":" in path:
            return f"{path!r} contains ':', which nsjail's src:dst mount syntax cannot express"
    return None


def unreadable_by_others(paths: JailPaths) -> str | None:
    """The first directory on the way to Python, its import path or this package that other users
    cannot enter."""
    for target in [*paths.binds, str(PACKAGE_DIR)]:
        for path in [*reversed(Path(target).parents), Path(target)]:
            if not os.stat(path).st_mode & 0o001:
                return str(path)
    return None
