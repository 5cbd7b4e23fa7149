"""The README's two commands (`make quickstart`, `make test`): set-up on first use, reused after,
redone when the install inputs change; missing system tools named with their install command."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed (apt-get install make)")


def _project(tmp_path: Path) -> Path:
    """The Makefile with the files its install step depends on (nothing is installed: make -n)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for rel in ("pyproject.toml", "scripts/install.sh", *(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "requirements").glob("*.txt"))):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def _dry(cwd: Path, target: str) -> str:
    return subprocess.run([MAKE, "-n", target], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_install_runs_once_then_again_when_pyproject_changes(tmp_path):
    proj = _project(tmp_path)
    first = _dry(proj, "test")
    assert "scripts/install.sh" in first and "-m venv .venv" in first
    assert ".venv/bin/python -m pytest -q" in first
    assert "scripts/install.sh" in _dry(proj, "quickstart") and ".venv/bin/rstar2 quickstart" in _dry(
        proj, "quickstart"
    )
    (proj / ".venv").mkdir()
    (proj / ".venv" / ".installed").touch()
    assert "scripts/install.sh" not in _dry(proj, "test")      # the stamp is newer: reused
    later = time.time() + 5
    os.utime(proj / "pyproject.toml", (later, later))
    assert "scripts/install.sh" in _dry(proj, "test")          # pyproject.toml changed: install again


def test_missing_system_tools_are_named_with_the_install_command(tmp_path):
    proj = _project(tmp_path)
    r = subprocess.run([MAKE, "system-check"], cwd=proj, capture_output=True, text=True,
                       env={**os.environ, "PATH": str(tmp_path / "empty")})
    assert r.returncode == 0
    assert "bubblewrap" in r.stderr and "redis-server" in r.stderr
    assert "apt-get install bubblewrap redis-server" in r.stderr

