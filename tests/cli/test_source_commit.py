"""Reports name the code that made them: the checkout's commit, or the installed version outside one."""
from __future__ import annotations

import re
import subprocess

from rstar2_cli import source_commit as sc


def test_a_checkout_reports_its_head_and_whether_tracked_files_changed():
    head = subprocess.run(["git", "-C", str(sc.REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    got = sc.source_commit()
    assert re.fullmatch(r"[0-9a-f]{12}(\+changes)?", got) and got.startswith(head)


def test_outside_a_checkout_it_names_the_installed_version(tmp_path, monkeypatch):
    monkeypatch.setattr(sc, "REPO", tmp_path)          # an installed package: no .git, no pyproject.toml
    assert sc.source_commit().endswith("(no git checkout)")
