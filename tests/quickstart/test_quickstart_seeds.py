"""`--seeds`: one run per seed, mean ± spread, and whether RoC's checks hold on every seed."""
from __future__ import annotations

import json

import pytest

from rstar2_cli.quickstart.seeds import parse_seeds, run_seeds, seed_spread
from rstar2_cli.quickstart.settings import QuickstartSettings


def _report(seed: int, roc_ratio: float, grpo_ratio: float, roc_acc: float = 0.95, grpo_acc: float = 0.93) -> dict:
    def method(ratio: float, acc: float) -> dict:
        return {"final_accuracy": acc, "tool_error_ratio_positive": ratio, "heldout_tool_error_ratio_positive": ratio,
                "tool_error_ratio_positive_curve": [0.3, ratio, ratio], "heldout_accuracy_curve": [[0, 0.3], [3, acc]]}
    return {"seed": seed, "sft_accuracy": 0.3, "final_accuracy": roc_acc, "minutes": 9.0,
            "improvement_points": round(100 * (roc_acc - 0.3), 1),
            "roc": method(roc_ratio, roc_acc), "grpo": method(grpo_ratio, grpo_acc)}


def test_parse_seeds_accepts_lists_and_names_bad_input():
    assert parse_seeds("0,1, 2") == [0, 1, 2]
    for bad in ("0,x", "", "1,1"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def test_summary_gives_mean_spread_and_every_seed_verdict():
    good = [_report(0, 0.02, 0.20), _report(1, 0.04, 0.10)]
    s = seed_spread(good)
    q = s["quantities"]["grpo.tool_error_ratio_positive"]
    assert q["mean"] == pytest.approx(0.15) and q["min"] == 0.10 and q["max"] == 0.20 and q["std"] > 0
    assert q["per_seed"] == [0.20, 0.10]
    assert s["roc_advantage_holds_on_every_seed"]
    # One seed where RoC does not halve GRPO's ratio: the verdict names it.
    bad = seed_spread(good + [_report(2, 0.09, 0.10)])
    assert not bad["roc_advantage_holds_on_every_seed"]
    check = next(c for name, c in bad["checks"].items() if "RoC's ratio" in name)
    assert check["per_seed"] == {"0": True, "1": True, "2": False} and not check["every_seed"]
    # No errors under GRPO at all (e.g. no positives): RoC has shown nothing.
    assert not next(c for n, c in seed_spread([_report(0, 0.0, 0.0)])["checks"].items() if "RoC's ratio" in n)[
        "every_seed"
    ]
    # RoC's accuracy more than 5 points below GRPO's fails the accuracy check.
    low = seed_spread([_report(0, 0.0, 0.2, roc_acc=0.80, grpo_acc=0.90)])
    assert not next(c for name, c in low["checks"].items() if "accuracy" in name)["every_seed"]


def test_run_seeds_writes_summary_and_reuses_finished_seeds(tmp_path):
    calls = []

    def run_one(s: QuickstartSettings) -> dict:
        calls.append(s.seed)
        s.out.mkdir(parents=True)
        (s.out / "settings.json").write_text(s.model_dump_json())
        r = _report(s.seed, 0.01 * s.seed, 0.2)
        (s.out / "report.json").write_text(json.dumps(r))
        return r

    base = QuickstartSettings.for_preset(tmp_path / "sweep", "smoke", compare_grpo=True)
    summary = run_seeds(base, [0, 3], run_one)
    assert calls == [0, 3] and summary["seeds"] == [0, 3]
    saved = json.loads((tmp_path / "sweep" / "report.json").read_text())
    assert saved["quantities"]["roc.tool_error_ratio_positive"]["per_seed"] == [0.0, 0.03]
    assert "seed 3" in (tmp_path / "sweep" / "report.md").read_text()
    assert (tmp_path / "sweep" / "report.png").read_bytes()[:4] == b"\x89PNG"
    run_seeds(base, [0, 3, 4], run_one)            # 0 and 3 are done with these settings
    assert calls == [0, 3, 4]
    rerun: list[int] = []                          # other settings: every seed runs again
    run_seeds(base.model_copy(update={"rl_steps": base.rl_steps + 1}), [0, 3],
              lambda s: rerun.append(s.seed) or _report(s.seed, 0.0, 0.2))
    assert rerun == [0, 3]


def test_cli_rejects_bad_seed_list_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from rstar2_cli.cli import app

    result = CliRunner().invoke(app, ["quickstart", "--seeds", "0,one", "--out", str(tmp_path / "qs")])
    assert result.exit_code == 2 and "--seeds" in result.output and not (tmp_path / "qs").exists()
