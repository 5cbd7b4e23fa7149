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
    """The Makefile with the files its install step depends on."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for rel in ("pyproject.toml", "scripts/install.sh", *(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "requirements").glob("*.txt"))):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def _recorder(path: Path, name: str, log: Path) -> None:
    """A stand-in program that appends `name` and its arguments to `log`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n')
    path.chmod(0o755)


def test_install_runs_once_then_again_when_pyproject_changes(tmp_path):
    """The targets run for real, with the install script and the venv's programs replaced by
    recorders (the venv's python exists, so make creates none)."""
    proj, log = _project(tmp_path / "proj"), tmp_path / "calls.log"
    _recorder(proj / "scripts" / "install.sh", "install.sh", log)
    _recorder(proj / ".venv" / "bin" / "python", "python", log)
    _recorder(proj / ".venv" / "bin" / "rstar2", "rstar2", log)

    def make(*args: str) -> list[str]:
        log.write_text("")
        subprocess.run([MAKE, *args], cwd=proj, capture_output=True, text=True, check=True)
        return log.read_text().splitlines()

    assert make("test", "ARGS=tests/quickstart") == ["install.sh ", "python -m pytest -q tests/quickstart"]
    assert (proj / ".venv" / ".installed").is_file()
    assert make("quickstart") == ["rstar2 quickstart --out runs/quickstart"]            # the stamp is newer: reused
    later = time.time() + 5
    os.utime(proj / "pyproject.toml", (later, later))
    assert make("test") == ["install.sh ", "python -m pytest -q"]                       # pyproject.toml changed


def test_missing_system_tools_are_named_with_the_install_command(tmp_path):
    proj = _project(tmp_path)
    r = subprocess.run([MAKE, "system-check"], cwd=proj, capture_output=True, text=True,
                       env={**os.environ, "PATH": str(tmp_path / "empty")})
    assert r.returncode == 0
    assert "bubblewrap" in r.stderr and "redis-server" in r.stderr
    assert "apt-get install bubblewrap redis-server" in r.stderr

