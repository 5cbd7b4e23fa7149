"""The shortened quickstart, end to end through the CLI: RL must lift held-out accuracy over SFT."""
from __future__ import annotations

import json

import pytest


@pytest.mark.slow
@pytest.mark.vllm
def test_smoke_quickstart_improves_heldout_accuracy(tmp_path):
    from typer.testing import CliRunner

    from rstar2_cli.cli import app

    out = tmp_path / "qs"
    result = CliRunner().invoke(app, ["quickstart", "--smoke", "--seed", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads((out / "report.json").read_text())
    assert report["final_accuracy"] > report["sft_accuracy"], report
    assert (out / "report.png").stat().st_size > 10_000
    assert "held-out accuracy" in (out / "report.md").read_text()
    # The curve's ends are the reported numbers, measured by run_eval on the trainer's engine.
    curve = json.loads((out / "rl_roc" / "heldout_curve.json").read_text())
    assert curve[0][0] == 0 and curve[0][1]["accuracy"] == report["sft_accuracy"]
    assert curve[-1][1]["accuracy"] == report["final_accuracy"]
