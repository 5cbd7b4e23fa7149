"""Every benchmark script answers `--help` (a help string argparse cannot format, e.g. a bare `%`,
crashes it before a user sees the options)."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted(p for p in (Path(__file__).resolve().parents[2] / "benchmarks").glob("*/*.py")
                    if '__name__ == "__main__"' in p.read_text())      # the scripts, not their helper modules


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_benchmark_prints_its_help(script):
    run = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout
