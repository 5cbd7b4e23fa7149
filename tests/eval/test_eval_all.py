"""`rstar2 eval all` end to end on the tiny checkpoint, offline, from fixture files: every row of
the paper's table is filled (or says why it is left out) and the report is written."""
from __future__ import annotations

import json

import pytest

from rstar2_cli.eval.benchmarks import BENCHMARKS, LEFT_OUT
from rstar2_cli.eval.paper_table import JSON_FILE, MD_FILE, ROWS, run_table
from rstar2_cli.eval.runner import TRAJ_FILE, run_eval
from rstar2_cli.eval.settings import EvalSettings

pytestmark = pytest.mark.slow

GPQA = [{"Record ID": f"g{i}", "Question": f"Which of these is number {i}?", "Correct Answer": str(i),
         "Incorrect Answer 1": str(i + 10), "Incorrect Answer 2": str(i + 20), "Incorrect Answer 3": str(i + 30)}
        for i in range(2)]
IFEVAL = [{"key": 1, "prompt": "Describe the sea without commas.", "instruction_id_list": ["punctuation:no_comma"],
           "kwargs": [{}]},
          {"key": 2, "prompt": "Write two sentences in lowercase.",
           "instruction_id_list": ["change_case:english_lowercase"], "kwargs": [{}]}]


@pytest.fixture
def all_data(tmp_path):
    """GPQA and IFEval rows; the math sets come from the package, bfcl's from bfcl-eval."""
    d = tmp_path / "data"
    d.mkdir()
    (d / "gpqa_diamond.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GPQA))
    (d / "ifeval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in IFEVAL))
    return d   # bfcl reads the questions bundled in bfcl-eval


def test_eval_all_fills_every_row(tiny_model, all_data, tmp_path, tiny_engine, sandbox_pool):
    def run_one(bench, model, out):
        s = EvalSettings(benchmark=bench, model=model, data_dir=str(all_data), out_dir=str(out), samples=2,
                         max_tokens=48, max_turns=2, limit=2, progress=False)
        return run_eval(s, engine=tiny_engine, tools=sandbox_pool)

    out = tmp_path / "table"
    table = run_table(run_one, str(tiny_model), out, BENCHMARKS, compare_model=str(tiny_model))
    assert [r["benchmark"] for r in table["rows"]] == [b for b, _ in ROWS]
    for r in table["rows"]:
        if r["benchmark"] in LEFT_OUT:
            assert not r["run"] and r["reason"]
            continue
        assert r["run"] and r["problems"] == 2 and r["k"] == 2
        assert 0.0 <= r["score"] <= 1.0 and 0.0 <= r["tool_call_rate"] <= 1.0 and r["response_tokens"] > 0
        c = r["compare"]
        assert c["n"] == 2 and c["ci95"][0] <= c["diff"] <= c["ci95"][1]
    saved = json.loads((out / JSON_FILE).read_text())
    assert saved["rows"] == json.loads(json.dumps(table["rows"]))
    md = (out / MD_FILE).read_text()
    for _, label in ROWS:
        assert label in md
    assert "left out" in md and "95 % interval" in md
    # the per-benchmark families wrote their own grade fields
    gpqa = [json.loads(l) for l in (out / "A" / "gpqa_diamond" / TRAJ_FILE).read_text().splitlines()]
    assert len(gpqa) == 4 and all(sorted(r["permutation"]) == [0, 1, 2, 3] for r in gpqa)
    ifeval = json.loads((out / "A" / "ifeval" / "results.json").read_text())
    assert set(ifeval["metrics"]["ifeval"]) == {"prompt_level_strict_acc", "inst_level_strict_acc",
                                                "prompt_level_loose_acc", "inst_level_loose_acc"}
    bfcl = json.loads((out / "A" / "bfcl" / "results.json").read_text())
    assert bfcl["metrics"]["bfcl"]["non_live_ast"] == table["rows"][[b for b, _ in ROWS].index("bfcl")]["score"]
    assert {r["category"] for r in (json.loads(l) for l in (out / "A" / "bfcl" / TRAJ_FILE).read_text().splitlines())} \
        == {"simple_python", "simple_java"}            # --limit 2 takes one question of each category in turn
    gpqa_row = table["rows"][[b for b, _ in ROWS].index("gpqa_diamond")]
    assert 0.0 <= gpqa_row["gpqa_boxed"] <= 1.0 and "gpqa_boxed" in md
    assert bfcl["reference"]["bfcl_eval"]


def test_no_tools_is_one_turn_without_schema(tiny_model, all_data, tmp_path, tiny_engine, sandbox_pool):
    s = EvalSettings(benchmark="gpqa_diamond", model=str(tiny_model), data_dir=str(all_data),
                     out_dir=str(tmp_path / "nt"), samples=1, max_tokens=32, limit=1, progress=False, use_tools=False)
    assert s.rollout_config().max_turns == 1 and not s.rollout_config().tools_in_prompt
    run_eval(s, engine=tiny_engine, tools=sandbox_pool)
    rows = [json.loads(l) for l in (tmp_path / "nt" / TRAJ_FILE).read_text().splitlines()]
    assert all(r["turns"] == 1 and r["tool_calls"] == 0 for r in rows)


@pytest.mark.vllm
def test_cli_compare_loads_one_engine_and_writes_the_table(tiny_model, all_data, tmp_path, monkeypatch):
    """The command end to end: `rstar2 eval aime24 CKPT --compare CKPT` starts its own engine
    (once: A and B are the same checkpoint) and prints the table it wrote."""
    from typer.testing import CliRunner

    from rstar2_cli.cli import app
    from rstar2_cli.eval import runner

    starts = []
    real = runner.make_engines

    def counting(s):
        starts.append(s.model)
        return real(s)

    monkeypatch.setattr(runner, "make_engines", counting)
    out = tmp_path / "cli"
    res = CliRunner().invoke(app, ["eval", "aime24", str(tiny_model), "--compare", str(tiny_model), "--data-dir",
                                   str(all_data), "--out", str(out), "--samples", "1", "--limit", "1",
                                   "--max-tokens", "16", "--max-turns", "1"])
    assert res.exit_code == 0, res.output
    assert starts == [str(tiny_model)]
    assert "| AIME24 |" in res.output and (out / MD_FILE).is_file()
    assert "engines: 1 replica x TP 1." in (out / MD_FILE).read_text()    # no GPU: one replica
    rows = json.loads((out / JSON_FILE).read_text())["rows"]
    assert [r["benchmark"] for r in rows] == ["aime24"] and rows[0]["compare"]["n"] == 1
