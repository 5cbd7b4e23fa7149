"""benchmarks/gpu/acceptance.py, the one entry point of the GPU acceptance checks: every check runs in its
own process, a failure does not stop the ones after it, each leaves a log, and the exit status and
summary.json say whether all passed."""
from __future__ import annotations

import json

import acceptance as gpu_checks


def test_a_failing_check_is_reported_and_the_rest_still_run(tmp_path):
    checks = [gpu_checks.Check("bad", "rejects its arguments", 0, ("gpu_shapes_check.py", "--model", "nope")),
              gpu_checks.Check("good", "prints its help", 0, ("check_gpu_apis.py", "--help"))]
    results = gpu_checks.run_checks(checks, tmp_path)
    assert [(r["check"], r["passed"]) for r in results] == [("bad", False), ("good", True)]
    assert results[0]["exit_code"] == 2 and "invalid choice: 'nope'" in (tmp_path / "bad.log").read_text()
    assert "usage:" in (tmp_path / "good.log").read_text()


def test_every_check_names_a_script_here_and_the_summary_gives_the_exit_status(tmp_path, monkeypatch):
    assert all((gpu_checks.HERE / c.argv[0]).is_file() for c in gpu_checks.CHECKS)
    failing = gpu_checks.Check("bad", "rejects its arguments", 0, ("gpu_shapes_check.py", "--model", "nope"))
    monkeypatch.setattr(gpu_checks, "CHECKS", (failing,))
    assert gpu_checks.main(["--out", str(tmp_path)]) == 1
    assert json.loads((tmp_path / "summary.json").read_text())[0]["passed"] is False
