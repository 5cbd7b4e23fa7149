"""Lines wrap at 120 characters ([tool.ruff] in pyproject.toml, rule E501 alone): `ruff check` over the
source trees and the tests finds nothing."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def ruff() -> list[str]:
    here = Path(sys.executable).with_name("ruff")       # the venv's, installed by rstar2[dev]
    found = str(here) if here.is_file() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return [found]


def test_ruff_finds_no_line_over_120_characters():
    run = subprocess.run(ruff() + ["check", "--output-format", "concise", "rstar2_cli", "sandbox", "benchmarks",
                                   "tests"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
