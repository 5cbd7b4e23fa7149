"""What the jail shows of the host's files, wherever the packages live: every folder the host's
Python imports from (site-packages, a PYTHONPATH folder, a .pth line), and never the project (the
working folder, the source checkout). Each test runs the pool in a subprocess whose sys.path,
working folder and install layout are the ones under test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sandbox.jail import backends
from sandbox.jail.backends import SandboxUnavailable

REPO = Path(__file__).resolve().parents[2]
JAILS = [pytest.param(name, id=name, marks=pytest.mark.skipif(problem is not None, reason=f"{name}: {problem}"))
         for name, problem in (("nsjail", backends.nsjail_problem()), ("bwrap", backends.bwrap_problem()))]

# Starts a pool on the backend argv[1] (stdlib preload plus what argv[2] names), runs the snippets
# of argv[3:] and prints one JSON line: the protections and each snippet's stdout / failure.
POOL_SCRIPT = """
import asyncio, json, sys
from sandbox import Limits, Sandbox
pool = Sandbox(workers=1, isolation=sys.argv[1], preload=tuple(["math", *filter(None, sys.argv[2].split(","))]),
               limits=Limits(timeout=20.0, cpu_time=20.0, memory_mb=1024))
try:
    runs = [pool.run_sync(code) for code in sys.argv[3:]]
    out = {"protections": pool.protections(),
           "runs": [r.stdout if r.ok else f"{r.reason}: {r.stderr[-300:]}" for r in runs]}
finally:
    asyncio.run(pool.close())
print(json.dumps(out))
"""


def _run_pool(python: str, cwd: Path, pythonpath: str | None, jail: str, preload: str, *snippets: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([python, "-c", POOL_SCRIPT, jail, preload, *snippets], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _extra_module(folder: Path) -> None:
    (folder / "rstar2_extra_dep").mkdir(parents=True)
    (folder / "rstar2_extra_dep" / "__init__.py").write_text("VALUE = 'from an extra sys.path entry'\n")


@pytest.mark.parametrize("jail", JAILS)
def test_a_dependency_on_an_extra_sys_path_entry_is_importable_in_the_jail(tmp_path, jail):
    """A module found only through PYTHONPATH (a temp folder): the zygote preloads it, a call
    imports it, and a light-tier call whose import the scan cannot see is re-run where it is."""
    deps, work = tmp_path / "deps", tmp_path / "work"
    _extra_module(deps)
    work.mkdir()
    (work / "answers.jsonl").write_text('{"answer": 42}\n')
    found = _run_pool(sys.executable, work, f"{REPO}{os.pathsep}{deps}", jail, "rstar2_extra_dep",
                      "import rstar2_extra_dep\nprint(rstar2_extra_dep.VALUE)",
                      "exec('imp' + 'ort rstar2_extra_dep as m')\nprint(m.VALUE)",
                      f"print(open({str(work / 'answers.jsonl')!r}).read())")
    assert found["runs"][:2] == ["from an extra sys.path entry\n"] * 2, found["runs"]
    assert found["runs"][2].startswith("runtime_error"), found["runs"][2]   # the working folder stays hidden
    assert found["protections"]["project_hidden"] is True, found["protections"]


@pytest.mark.parametrize("jail", JAILS)
def test_project_is_hidden_when_the_package_is_installed_in_site_packages(tmp_path, jail):
    """The sandbox package installed in a venv's site-packages (as from a wheel), its dependencies
    on another site-packages named by a .pth line: `project_hidden` is measured on the working
    folder, and the dependencies import in the jail."""
    venv, work = tmp_path / "venv", tmp_path / "work"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    shutil.copytree(REPO / "sandbox", site / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")     # numpy, sympy: this venv's
    work.mkdir()
    (work / "runs").mkdir()
    found = _run_pool(python, work, None, jail, "numpy",
                      "import numpy, sandbox\nprint(numpy.__name__, sandbox.__file__)")
    assert found["runs"] == ["numpy /opt/rstar2/sandbox/__init__.py\n"], found["runs"]
    assert found["protections"]["project_hidden"] is True, found["protections"]


@pytest.mark.parametrize("jail", JAILS)
def test_a_sys_path_entry_that_holds_the_project_stops_the_pool_in_one_line(tmp_path, monkeypatch, jail):
    """Binding it would show the working folder: the pool does not start, and says which entry."""
    outer = tmp_path / "outer"
    (outer / "work").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(outer))
    monkeypatch.chdir(outer / "work")
    with pytest.raises(SandboxUnavailable) as e:
        backends.plan(jail, False, 1, None)
    assert str(outer) in str(e.value) and "\n" not in str(e.value)
    assert backends.plan("none", True, 1, None).backend == "none"     # nothing is mounted there


def test_the_jails_view_of_sys_path(tmp_path, monkeypatch):
    """Host order kept; the project and what lies in it left out; a folder elsewhere bound; an
    entry over the jail's own mount points named as the problem; the probe's allowance for a
    folder is only what the jail mounts inside it."""
    from sandbox.jail import paths

    work, deps = tmp_path / "work", tmp_path / "deps"
    (work / "tools").mkdir(parents=True)
    deps.mkdir()
    monkeypatch.chdir(work)
    site = sysconfig.get_paths()["purelib"]
    monkeypatch.setattr(sys, "path", ["", str(work / "tools"), str(deps), str(tmp_path / "gone"), site])
    view = paths.jail_paths()
    assert view.sys_path == (str(deps), site) and str(deps) in view.binds and view.problem is None
    assert str(work) in view.project and not any(paths.inside(b, str(work)) for b in view.binds)
    assert view.shown_names(str(tmp_path)) == ["deps"]
    monkeypatch.setattr(sys, "path", ["/opt", site])
    problem = paths.jail_paths().problem
    assert "'/opt'" in problem and paths.JAIL_PACKAGE_ROOT in problem and "\n" not in problem


def test_a_site_packages_inside_the_working_folder_is_bound(tmp_path, monkeypatch):
    """The user site under a home you run from (`pip install --user`, then `cd ~`): installed
    packages, not project files, so the jail shows that folder and nothing else of the home."""
    from sandbox.jail import paths

    user_site = tmp_path / ".local" / "lib" / "python3.11" / "site-packages"
    user_site.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(user_site), sysconfig.get_paths()["purelib"]])
    view = paths.jail_paths()
    assert str(user_site) in view.binds and view.sys_path[0] == str(user_site)
    assert view.shown_names(str(tmp_path)) == [".local"]


@pytest.mark.parametrize("jail", JAILS)
def test_a_preloaded_module_in_the_hidden_project_stops_the_pool_in_one_line(tmp_path, monkeypatch, jail):
    """What the zygote must import but the jail hides: named at pool start, not a traceback from
    the zygote."""
    work = tmp_path / "work"
    _extra_module(work / "vendor")
    monkeypatch.syspath_prepend(str(work / "vendor"))
    monkeypatch.chdir(work)
    with pytest.raises(SandboxUnavailable) as e:
        backends.plan(jail, False, 1, None, preload=("math", "rstar2_extra_dep"))
    assert "rstar2_extra_dep" in str(e.value) and str(work / "vendor") in str(e.value) and "\n" not in str(e.value)
    from sandbox.service.embedded import preflight      # the service refuses before it binds its port

    with pytest.raises(SandboxUnavailable, match="rstar2_extra_dep"):
        preflight({"isolation": jail, "preload": ["math", "rstar2_extra_dep"]})
