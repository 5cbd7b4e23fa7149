"""Which code produced a figure: the git commit of the checkout rstar2 runs from.

Why: a figure in the README or docs is only checkable if its report says what ran. Reports
(the quickstart's report.json and report.md, benchmarks/compare/bench_vs_trl.py's result.json)
carry `source_commit()`; a figure quoted in a doc names it.
"""
from __future__ import annotations

import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def source_commit() -> str:
    """`abc1234` (short hash), with `+changes` when tracked files differ from it; for an installed
    package outside a checkout, `rstar2 VERSION (no git checkout)`."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0 and (REPO / "rstar2_cli").is_dir() and (REPO / "pyproject.toml").is_file():
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=30).stdout.strip()
            return head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"rstar2 {version('rstar2')} (no git checkout)"
    except PackageNotFoundError:
        return "unknown (no git checkout, not installed)"
