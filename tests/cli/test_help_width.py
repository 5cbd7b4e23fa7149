"""Every command's --help fits an 80-column terminal and names each of its flags whole: click's
plain help wraps the text (rich's panels cut flag names and help at 80 columns with an ellipsis)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command

from rstar2_cli.cli import app

REPO = Path(__file__).resolve().parents[2]
ROOT = get_command(app)
COMMANDS = [[name] for name, cmd in ROOT.commands.items() if not hasattr(cmd, "commands")]
COMMANDS += [[name, sub] for name, cmd in ROOT.commands.items() for sub in getattr(cmd, "commands", {})]


def _command(path: list[str]):
    cmd = ROOT
    for name in path:
        cmd = cmd.commands[name]
    return cmd


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_help_fits_80_columns_and_names_every_flag_whole(path):
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "rstar2_cli.cli", *path, "--help"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    too_long = [line for line in out.stdout.splitlines() if len(line) > 80]
    assert not too_long, too_long
    assert "…" not in out.stdout
    for param in _command(path).params:
        for flag in [*param.opts, *param.secondary_opts]:
            if flag.startswith("-"):
                assert flag in out.stdout, f"{flag} missing from `rstar2 {' '.join(path)} --help`"
