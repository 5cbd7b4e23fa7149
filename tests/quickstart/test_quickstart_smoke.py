"""The shortened quickstart, end to end through the CLI: RL must lift held-out accuracy over SFT."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess

import pytest


@pytest.mark.slow
@pytest.mark.vllm
def test_smoke_quickstart_improves_heldout_accuracy(tmp_path):
    from typer.testing import CliRunner

    from rstar2_cli.cli import app

    out = tmp_path / "qs"
    result = CliRunner().invoke(app, ["quickstart", "--smoke", "--seed", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    # what the terminal shows: a banner per stage and the RL run's own, none of vLLM's INFO lines
    # (they are in the run's logs/), one table row per RL step
    for banner in ("quickstart 1/4: the toy task", "quickstart 2/4: non-reasoning SFT",
                   "quickstart 3/4: RL with GRPO-RoC, 6 steps", "quickstart 4/4: the report", "): steps 1..6, starts"):
        assert banner in result.output, banner
    assert not re.search(r"^(INFO|DEBUG) \d\d-\d\d ", result.output, re.M), result.output[-3000:]
    assert "engine" in (out / "rl_roc" / "logs" / "vllm_rank0.log").read_text().lower()
    report = json.loads((out / "report.json").read_text())
    assert report["final_accuracy"] > report["sft_accuracy"], report
    assert (out / "report.png").stat().st_size > 10_000
    assert "held-out accuracy" in (out / "report.md").read_text()
    # The curve's ends are the reported numbers, measured by run_eval on the trainer's engine.
    curve = json.loads((out / "rl_roc" / "heldout_curve.json").read_text())
    assert curve[0][0] == 0 and curve[0][1]["accuracy"] == report["sft_accuracy"]
    assert curve[-1][1]["accuracy"] == report["final_accuracy"]
    # every RL step left its rollouts, and `rstar2 inspect` makes a page of the run a browser shows
    rl_run = out / "rl_roc"
    steps = [row["step"] for row in map(json.loads, (rl_run / "metrics.jsonl").read_text().splitlines())
             if row.get("step", 0) >= 1]
    logged = sorted((rl_run / "rollouts").glob("step_*.jsonl.gz"))
    assert [int(p.name[5:11]) for p in logged] == sorted(set(steps)), logged
    first = [json.loads(line) for line in gzip.open(logged[0], "rt")]
    assert first and {"turns", "reward", "roc", "advantage"} <= set(first[0])
    shown = CliRunner().invoke(app, ["inspect", str(rl_run)])
    assert shown.exit_code == 0, shown.output
    page = rl_run / "inspect.html"
    assert page.is_file() and str(page) in shown.output
    chromium = shutil.which("chromium")
    if chromium:                      # Debian's chromium, as root only without its sandbox
        flags = ["--headless", "--disable-gpu"] + (["--no-sandbox"] if os.geteuid() == 0 else [])
        dom = subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                             timeout=120).stdout
        assert f"from {len(set(steps))} steps" in dom and "RoC kept" in dom
        subprocess.run([chromium, *flags, f"--screenshot={rl_run / 'inspect.png'}", "--window-size=1400,1000",
                        page.as_uri()], capture_output=True, timeout=120, check=True)
        assert (rl_run / "inspect.png").stat().st_size > 10_000
