"""A quickstart rerun into its --out folder starts clean: the earlier run's own folders and files go
(its RL metrics would otherwise gain a second run's steps 1, 2, ..., and its held-out evals would
resume the old model's trajectories), with one line saying so; anything else there stays. The
stages are stubbed to write what the real ones write, so the test runs in a second."""
from __future__ import annotations

import json
from pathlib import Path

from rstar2_cli.quickstart import pipeline
from rstar2_cli.quickstart.prepare import PreparedToy
from rstar2_cli.quickstart.settings import QuickstartSettings


def _stub_stages(monkeypatch) -> None:
    def prepare_toy(s, root: Path) -> PreparedToy:
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "model_init").mkdir(exist_ok=True)
        return PreparedToy(root / "data" / "train.jsonl", root / "data" / "heldout.jsonl", root / "data" / "sft.jsonl",
                           root / "model_init", {})

    def sft_stage(s, prep, progress) -> str:
        (s.out / "sft" / "final").mkdir(parents=True, exist_ok=True)
        return str(s.out / "sft" / "final")

    def rl_stage(s, prep, sft_model, *, roc, progress) -> pipeline.RlRun:
        run = s.out / ("rl_roc" if roc else "rl_grpo")
        (run / "heldout" / "step_0000").mkdir(parents=True, exist_ok=True)
        with (run / "metrics.jsonl").open("a") as f:          # as the trainer's MetricsWriter appends
            f.write(json.dumps({"step": 1}) + "\n")
        return pipeline.RlRun("roc" if roc else "grpo")

    monkeypatch.setattr(pipeline, "prepare_toy", prepare_toy)
    monkeypatch.setattr(pipeline, "sft_stage", sft_stage)
    monkeypatch.setattr(pipeline, "rl_stage", rl_stage)
    monkeypatch.setattr(pipeline, "build_report", lambda *a, **k: {"final_accuracy": 1.0})
    monkeypatch.setattr(pipeline, "write_report", lambda out, report, runs: (out / "report.json").write_text("{}"))


def test_a_rerun_into_the_same_folder_starts_clean_and_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    _stub_stages(monkeypatch)
    out = tmp_path / "qs"
    pipeline.run_quickstart(QuickstartSettings.for_preset(out, "smoke", compare_grpo=True), progress=False)
    assert capsys.readouterr().out == ""                       # a new folder: nothing to say
    (out / "notes.txt").write_text("mine")                     # not the quickstart's: stays
    (out / "rl_roc" / "step_000004").mkdir()                   # a checkpoint of the first run

    pipeline.run_quickstart(QuickstartSettings.for_preset(out, "smoke"), progress=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines == [f"quickstart: {out} held an earlier run; removed its data, model_init, sft, rl_grpo, rl_roc, "
                     "settings.json, report.json and starting clean (the quickstart owns these)"]
    assert (out / "rl_roc" / "metrics.jsonl").read_text().splitlines() == ['{"step": 1}']
    assert not (out / "rl_roc" / "step_000004").exists() and not (out / "rl_grpo").exists()
    assert (out / "notes.txt").read_text() == "mine" and (out / "report.json").is_file()
