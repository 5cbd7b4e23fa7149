"""The report folder: report.json carries the promised keys, the PNG and markdown are written."""
from __future__ import annotations

import json

from rstar2_cli.quickstart.pipeline import RlRun
from rstar2_cli.quickstart.report import write_report


def _run(label: str, ratios: list[float], accs: list[float]) -> RlRun:
    steps = [{"step": float(i + 1), "rollout/reward_mean": 0.1 * i, "rollout/tool_error_ratio_positive": r,
              "rollout/response_length_mean": 80.0} for i, r in enumerate(ratios)]
    held = [(4 * i, {"accuracy": a, "tool_error_ratio_positive": 0.0}) for i, a in enumerate(accs)]
    return RlRun(label, steps=steps, heldout=held, checkpoint=f"/ckpt/{label}", seconds=12.0)


def test_final_tool_error_ratio_is_the_second_half_mean():
    run = _run("roc", [0.4, 0.4, 0.2, 0.0], [0.3, 0.9])
    assert run.final_tool_error_ratio_positive() == 0.1
    s = run.summary()
    assert s["start_accuracy"] == 0.3 and s["final_accuracy"] == 0.9


def test_write_report_with_grpo_comparison(tmp_path):
    roc, grpo = _run("roc", [0.3, 0.1, 0.0, 0.0], [0.4, 0.95]), _run("grpo", [0.3, 0.3, 0.2, 0.1], [0.4, 0.9])
    report = {"seed": 7, "preset": "smoke", "sft_accuracy": 0.4, "final_accuracy": 0.95, "minutes": 3.0,
              "total_minutes": 5.0, "heldout_problems": 10, "heldout_samples": 1, "improvement_points": 55.0,
              "roc": roc.summary(), "grpo": grpo.summary()}
    write_report(tmp_path, report, [roc, grpo])
    saved = json.loads((tmp_path / "report.json").read_text())
    for key in ("sft_accuracy", "final_accuracy", "minutes"):
        assert saved[key] == report[key]
    for label in ("roc", "grpo"):
        assert {"final_accuracy", "tool_error_ratio_positive"} <= set(saved[label])
    assert saved["roc"]["tool_error_ratio_positive"] < saved["grpo"]["tool_error_ratio_positive"]
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "RoC vs plain GRPO" in md and "+55.0 points" in md
