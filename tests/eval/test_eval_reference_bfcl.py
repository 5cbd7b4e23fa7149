"""BFCL scores on canned responses (tests/eval/fixtures/bfcl_responses.jsonl: three questions of
every bundled non-live category, several response shapes each) equal bfcl-eval's own entry
points: `eval_runner.evaluate_task` with the real QwenFCHandler per entry, and
`eval_runner_helper.generate_leaderboard_csv`'s non-live table for the summary."""
from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
from reference_fixtures import import_bfcl_runner, read_jsonl

from rstar2_cli.eval import reference
from rstar2_cli.rollout.trajectory import Trajectory

MODEL = reference.BFCL_MODEL_NAME


@pytest.fixture(scope="module")
def bfcl(tmp_path_factory):
    runner, helper, qwen = import_bfcl_runner()
    handler = qwen(model_name="Qwen/Qwen3-8B", temperature=0, registry_name=MODEL, is_fc_model=True)
    return SimpleNamespace(runner=runner, helper=helper, handler=handler, tmp=tmp_path_factory.mktemp("bfcl"))


def _ours(rows):
    from rstar2_cli.eval.bfcl import BFCL, package_rows, problem_from_row

    problems = {}
    for cat in {r["category"] for r in rows}:
        for i, row in enumerate(package_rows(cat), 1):
            problems[row["id"]] = problem_from_row(row, "bfcl_eval", i)
    trajs = [Trajectory(prompt_id=r["id"], sample_index=k, text=r["text"]) for k, r in enumerate(rows)]
    return BFCL.grade(trajs, problems, None)


def _reference_table(bfcl, rows) -> dict:
    """bfcl-eval's leaderboard table of one "model run" (each question at most once per category)."""
    table: dict = {}
    for cat in sorted({r["category"] for r in rows}):
        results = [{"id": r["id"], "result": r["text"]} for r in rows if r["category"] == cat]
        bfcl.runner.evaluate_task(cat, bfcl.tmp, bfcl.tmp / "score", results, MODEL, bfcl.handler, table,
                                  allow_missing=True)
    return table[MODEL]


def test_every_verdict_equals_bfcl_evaluate_task(bfcl):
    rows = read_jsonl("bfcl_responses.jsonl")
    ours = _ours(rows)
    ref = [_reference_table(bfcl, [r])[r["category"]]["accuracy"] == 1.0 for r in rows]
    assert [g["reward"] == 1.0 for g in ours] == ref
    by = {(r["category"], r["kind"]): [] for r in rows}
    for r, g in zip(rows, ours):
        by[(r["category"], r["kind"])].append(g["reward"])
    # hand-known shapes: BFCL's Qwen parser needs the newlines inside <tool_call>
    assert by[("simple_python", "right")] == [1.0] * 3 and by[("simple_python", "right_no_newlines")] == [0.0] * 3
    assert by[("parallel_multiple", "right")] == [1.0] * 3 and by[("multiple", "arguments_not_object")] == [0.0] * 3
    assert by[("irrelevance", "no_call")] == [1.0] * 3 and by[("irrelevance", "call")] == [0.0] * 3
    assert by[("irrelevance", "call_no_newlines")] == [1.0] * 3      # undecodable: no call, as BFCL reads it


@pytest.mark.parametrize("run", [0, 1, 2, 3])
def test_summary_equals_bfcl_leaderboard_csv(bfcl, run, monkeypatch):
    """One "model run" per shape index (run 3 leaves out the Java set: BFCL counts it 0)."""
    from rstar2_cli.eval.bfcl import accuracy

    rows = read_jsonl("bfcl_responses.jsonl")
    kinds = {c: sorted({r["kind"] for r in rows if r["category"] == c}) for c in {r["category"] for r in rows}}
    picked = [r for r in rows if r["kind"] == kinds[r["category"]][run % len(kinds[r["category"]])]
              and not (run == 3 and r["category"] == "simple_java")]
    ours = accuracy([dict(g, category=r["category"]) for g, r in zip(_ours(picked), picked)])
    table = {MODEL: _reference_table(bfcl, picked)}
    config = SimpleNamespace(display_name="m", url="", org="", license="", input_price=None, output_price=None,
                             is_fc_model=True, underscore_to_dot=False)
    monkeypatch.setattr(bfcl.helper, "MODEL_CONFIG_MAPPING", {MODEL: config})
    out = bfcl.tmp / f"csv{run}"
    out.mkdir()
    bfcl.helper.generate_leaderboard_csv(table, out)
    with (out / "data_non_live.csv").open() as f:
        ref = next(csv.DictReader(f))

    def pct(x):
        return "{:.2f}%".format(x * 100)

    assert ref["Non-Live Overall Acc"] == pct(ours["non_live_ast"])
    assert ref["AST Summary"] == ("N/A" if ours["missing"] and run == 3 else pct(ours["non_live_ast"]))
    columns = {"Python Simple AST": "simple_python", "Java Simple AST": "simple_java",
               "JavaScript Simple AST": "simple_javascript", "Multiple AST": "multiple", "Parallel AST": "parallel",
               "Parallel Multiple AST": "parallel_multiple", "Irrelevance Detection": "irrelevance"}
    for column, cat in columns.items():
        assert ref[column] == ("N/A" if cat in ours["missing"] else pct(ours[cat])), column
    for cat in columns.values():                  # and exactly, per category
        if cat not in ours["missing"]:
            assert table[MODEL][cat]["accuracy"] == ours[cat]


def test_runs_every_bundled_non_live_category_with_bfcl_hints():
    from rstar2_cli.eval.bfcl import CATEGORIES, package_rows

    sizes = {c: len(package_rows(c)) for c in CATEGORIES}
    assert sizes == {"simple_python": 400, "simple_java": 100, "simple_javascript": 50, "multiple": 200,
                     "parallel": 200, "parallel_multiple": 200, "irrelevance": 240}
    assert package_rows("simple_python")[0]["function"][0]["description"].endswith(
        " Note that the provided function is in Python 3 syntax.")
    assert package_rows("simple_java")[0]["function"][0]["description"].endswith(
        " Note that the provided function is in Java 8 SDK syntax.")


def test_limit_samples_every_category():
    from rstar2_cli.eval.bfcl import BFCL, CATEGORIES
    from rstar2_cli.eval.settings import EvalSettings

    first = BFCL.load(EvalSettings(benchmark="bfcl", model="m"))[: len(CATEGORIES)]
    assert [p.extra["category"] for p in first] == list(CATEGORIES)


def test_report_shows_the_summary_categories_and_what_was_not_run():
    from rich.console import Console

    from rstar2_cli.eval.bfcl import accuracy
    from rstar2_cli.eval.report import metrics_table

    stats = {"mean": 1.0, "median": 1.0}
    m = {"problems": 2, "samples_per_problem": 1, "avg@1": 0.5, "avg@1_std": 0.0, "response_tokens": stats,
         "turns": stats, "tool_calls": stats, "tool_error_rate": 0.0,
         "bfcl": accuracy([{"category": "simple_python", "reward": 1.0}, {"category": "irrelevance", "reward": 0.0}])}
    console = Console(width=200, record=True)
    console.print(metrics_table({"benchmark": "bfcl", "model": "m", "metrics": m}))
    text = console.export_text()
    assert "bfcl non live ast" in text and "bfcl missing" in text and "simple_java" in text
