"""`--compare`: the difference and its 95 % interval on a constructed pair of results."""
from __future__ import annotations

import json
import math

import pytest

from rstar2_cli.eval.compare import paired_difference, per_question


def _results(solved: dict[str, float]) -> dict:
    return {"per_problem": [{"problem_id": q, "solved_fraction": f} for q, f in solved.items()]}


def test_compare_by_hand():
    # A (e.g. RL) and B (e.g. SFT), 4 samples per question; q5 only in A (ignored: not paired)
    a = _results({"q1": 1.0, "q2": 0.75, "q3": 0.5, "q4": 0.25, "q5": 1.0})
    b = _results({"q1": 0.5, "q2": 0.75, "q3": 0.0, "q4": 0.5})
    out = paired_difference(per_question(a), per_question(b))
    # by hand: d = [0.5, 0, 0.5, -0.25]; mean 0.1875; deviations 0.3125, -0.1875, 0.3125, -0.4375;
    # squares sum 0.09765625 + 0.03515625 + 0.09765625 + 0.19140625 = 0.421875; / (n-1=3) = 0.140625;
    # stdev 0.375; se = 0.375 / 2 = 0.1875; half width 1.959964 * 0.1875 = 0.367493
    assert out["n"] == 4 and out["only_in_a"] == 1 and out["only_in_b"] == 0
    assert out["a"] == pytest.approx(0.625) and out["b"] == pytest.approx(0.4375)
    assert out["diff"] == pytest.approx(0.1875)
    assert out["se"] == pytest.approx(0.1875)
    assert out["ci95"] == pytest.approx([0.1875 - 0.3674932, 0.1875 + 0.3674932], abs=1e-6)
    assert "paired" in out["method"]


def test_compare_identical_runs_is_zero_and_symmetric():
    a = {"q1": 1.0, "q2": 0.0, "q3": 0.5}
    same = paired_difference(a, a)
    assert same["diff"] == 0 and same["ci95"] == [0.0, 0.0]
    b = {"q1": 0.0, "q2": 0.5, "q3": 0.5}
    ab, ba = paired_difference(a, b), paired_difference(b, a)
    assert ab["diff"] == -ba["diff"] and math.isclose(ab["ci95"][0], -ba["ci95"][1])


def test_compare_rejects_results_without_a_shared_question():
    with pytest.raises(ValueError, match="share no question"):
        paired_difference({"q1": 1.0}, {"q2": 1.0})


def _fake_results(bench: str, solved: dict[str, float], k: int = 2) -> dict:
    metrics = {"problems": len(solved), "samples_per_problem": k, f"avg@{k}": sum(solved.values()) / len(solved),
               f"avg@{k}_std": 0.0, "response_tokens": {"mean": 10.0, "median": 10.0}, "tool_call_rate": 0.5}
    if bench == "bfcl":
        from rstar2_cli.eval.bfcl import accuracy

        metrics["bfcl"] = accuracy(
            [
                {"category": c, "reward": r}
                for c, r in (("simple_python", 1.0), ("multiple", 1.0), ("parallel", 1.0), ("parallel_multiple", 0.0))
            ]
        )
    return {"benchmark": bench, "metrics": metrics, "reference": None,
            "per_problem": [{"problem_id": q, "solved_fraction": f} for q, f in solved.items()]}


def test_table_rows_in_paper_order_with_left_out_and_compare(tmp_path):
    from rstar2_cli.eval.paper_table import JSON_FILE, MD_FILE, ROWS, run_table

    calls = []

    def run_one(bench, model, out):
        calls.append((bench, model))
        return _fake_results(bench, {"q1": 1.0, "q2": 0.5} if model == "A" else {"q1": 0.5, "q2": 0.5})

    table = run_table(run_one, "A", tmp_path, ["bfcl", "aime24", "custom"], compare_model="B")
    assert calls == [("aime24", "A"), ("bfcl", "A"), ("custom", "A"), ("aime24", "B"), ("bfcl", "B"), ("custom", "B")]
    assert [r["benchmark"] for r in table["rows"]] == ["aime24", "bfcl", "arena_hard", "custom"]
    aime, bfcl, arena, _ = table["rows"]
    # BFCL's summary: simple = mean(python 1, java 0, javascript 0) (not run: 0), then the mean of four
    assert aime["score"] == 0.75 and bfcl["score"] == pytest.approx((1 / 3 + 1 + 1 + 0) / 4) and not arena["run"]
    assert bfcl["bfcl_missing"] == ["simple_java", "simple_javascript", "irrelevance"]
    assert aime["compare"]["diff"] == pytest.approx(0.25)
    md = (tmp_path / MD_FILE).read_text()
    assert "| AIME24 | 75.0 | 75.0 ± 0.0 | 2 | 10 | 50.0 |" in md and "+25.0" in md
    assert json.loads((tmp_path / JSON_FILE).read_text())["compare_model"] == "B"
    assert [r["benchmark"] for r in run_table(run_one, "A", tmp_path, ["aime24"], with_left_out=False)["rows"]] == [
        "aime24"
    ]


def test_table_lists_sets_without_data_and_runs_the_rest(tmp_path):
    """`eval all` without GPQA / IFEval data: those rows say "no data" and how to add them; a set
    that fails to load mid-table joins them instead of stopping the table."""
    from rstar2_cli.data.problems import DataError
    from rstar2_cli.eval.paper_table import MD_FILE, run_table

    def run_one(bench, model, out):
        if bench == "math500":
            raise DataError("hub:HuggingFaceH4/MATH-500: load failed: offline")
        return _fake_results(bench, {"q1": 1.0})

    no_data = {"gpqa_diamond": "no data: run `rstar2 prepare eval-data --gpqa FILE --out DIR`"}
    table = run_table(run_one, "A", tmp_path, ["aime24", "math500", "gpqa_diamond"], no_data=no_data)
    rows = {r["benchmark"]: r for r in table["rows"]}
    assert rows["aime24"]["run"] and not rows["gpqa_diamond"]["run"] and not rows["math500"]["run"]
    assert rows["gpqa_diamond"]["reason"] == no_data["gpqa_diamond"]
    assert (
        rows["math500"]["reason"].startswith("no data: hub:HuggingFaceH4/MATH-500")
        and "--data-dir" in rows["math500"]["reason"]
    )
    assert rows["arena_hard"]["reason"].startswith("left out: ")
    md = (tmp_path / MD_FILE).read_text()
    assert "prepare eval-data --gpqa" in md and "left out: needs an LLM judge" in md
