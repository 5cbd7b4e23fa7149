"""Getting GPQA / IFEval onto an offline machine, and `rstar2 eval` finding its sets and context:
`rstar2 prepare eval-data` validates and writes the sets where eval reads them (one-line errors
naming the row), `eval all` lists a set without data instead of stopping, a benchmark name is
never read as a path in the working directory, and the engine's context follows the model's."""
from __future__ import annotations

import csv
import json

import pytest
from reference_fixtures import FIXTURES, read_jsonl
from typer.testing import CliRunner

from rstar2_cli.cli import app


def _prepare(*args):
    return CliRunner().invoke(app, ["prepare", "eval-data", *map(str, args)])


def test_prepare_eval_data_writes_what_eval_reads(tmp_path):
    from rstar2_cli.eval.benchmarks import family_of
    from rstar2_cli.eval.settings import EvalSettings

    out = tmp_path / "data"
    res = _prepare("--gpqa", FIXTURES / "gpqa_rows.jsonl", "--ifeval", FIXTURES / "ifeval_rows.jsonl", "--out", out)
    assert res.exit_code == 0, res.output
    assert "gpqa_diamond: wrote 3 rows (the Hub set has 198)" in res.output
    assert f"--data-dir {out}" in res.output
    for bench, n in (("gpqa_diamond", 3), ("ifeval", 6)):
        problems = family_of(bench).load(EvalSettings(benchmark=bench, model="m", data_dir=str(out)))
        assert len(problems) == n
    gpqa = family_of("gpqa_diamond").load(EvalSettings(benchmark="gpqa_diamond", model="m", data_dir=str(out)))
    assert [p.id for p in gpqa] == [r["Record ID"] for r in read_jsonl("gpqa_rows.jsonl")]


def test_prepare_eval_data_reads_gpqa_release_csv(tmp_path):
    rows = read_jsonl("gpqa_rows.jsonl")
    src = tmp_path / "gpqa_diamond.csv"
    with src.open("w", newline="") as f:       # the release's CSV has more columns than eval reads
        w = csv.DictWriter(f, fieldnames=[*rows[0], "Subdomain"])
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, Subdomain="Chemistry"))
    res = _prepare("--gpqa", src, "--out", tmp_path / "d")
    assert res.exit_code == 0, res.output
    written = [json.loads(line) for line in (tmp_path / "d" / "gpqa_diamond.jsonl").read_text().splitlines()]
    assert written[0]["Record ID"] == rows[0]["Record ID"] and "Subdomain" not in written[0]


@pytest.mark.parametrize("flag,row,match", [
    ("--gpqa", {"Record ID": "r", "Question": "q", "Correct Answer": "a", "Incorrect Answer 1": "b",
                "Incorrect Answer 2": "c"}, "bad.jsonl:2: missing field 'Incorrect Answer 3'"),
    ("--gpqa", {"Record ID": "r", "Question": "q", "Correct Answer": 7, "Incorrect Answer 1": "b",
                "Incorrect Answer 2": "c", "Incorrect Answer 3": "d"}, "bad.jsonl:2: field 'Correct Answer' must be"),
    ("--ifeval", {"key": 9, "prompt": "p", "instruction_id_list": ["no:such"], "kwargs": [{}]},
     "bad.jsonl:2: unknown IFEval instruction 'no:such'"),
    ("--ifeval", {"key": 9, "prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": ["x"]},
     "bad.jsonl:2: field 'kwargs' must be a list of objects"),
])
def test_prepare_eval_data_bad_row_is_one_line_naming_it(tmp_path, flag, row, match):
    good = read_jsonl("gpqa_rows.jsonl" if flag == "--gpqa" else "ifeval_rows.jsonl")[0]
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    res = _prepare(flag, src, "--out", tmp_path / "d")
    assert res.exit_code == 2 and match in res.output and res.output.count("\n") == 1, res.output
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_prepare_eval_data_duplicate_ids_and_usage_errors(tmp_path):
    row = read_jsonl("ifeval_rows.jsonl")[0]
    src = tmp_path / "dup.jsonl"
    src.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    res = _prepare("--ifeval", src, "--out", tmp_path / "d")
    assert res.exit_code == 2 and "dup.jsonl:2: duplicate id '1' (first at row 1)" in res.output
    res = _prepare("--out", tmp_path / "d")
    assert res.exit_code == 2 and "--gpqa FILE" in res.output
    res = _prepare("--gpqa", tmp_path / "none.jsonl", "--out", tmp_path / "d")
    assert res.exit_code == 2 and "--gpqa" in res.output and "no such file" in res.output


def test_prepare_eval_data_from_an_empty_hub_cache_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    res = _prepare("--from-hub", "--out", tmp_path / "d")
    assert res.exit_code == 2 and "not in the local Hugging Face datasets cache" in res.output
    assert "Idavidrein/gpqa" in res.output and "google/IFEval" in res.output


# ------------------------------------------------------------------ eval finds its sets
def _fake_checkpoint(path, max_position_embeddings=2048):
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "max_position_embeddings": max_position_embeddings})
    )
    (path / "model.safetensors").write_bytes(b"")
    (path / "tokenizer.json").write_text("{}")
    return path


def test_eval_all_offline_without_gpqa_ifeval_lists_them_and_runs_the_rest(tmp_path, monkeypatch, data_dir):
    """The command's flow with the generation stubbed (the slow end-to-end run is
    test_eval_all.py): rows with data run, GPQA / IFEval say "no data" with the command that adds them."""
    from rstar2_cli.eval import runner
    from rstar2_cli.eval.benchmarks import family_of
    from rstar2_cli.eval.bfcl import CATEGORIES

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")      # nothing listens: the Hub does not answer
    ran = []

    def fake_run_eval(s, engine=None, **_):
        problems = family_of(s.benchmark).load(s)
        ran.append(s.benchmark)
        k = s.samples
        return {
            "benchmark": s.benchmark,
            "reference": None,
            "per_problem": [],
            "metrics": {
                "problems": len(problems),
                "samples_per_problem": k,
                f"avg@{k}": 0.5,
                f"avg@{k}_std": 0.0,
                "response_tokens": {"mean": 1.0},
                "tool_call_rate": 0.0,
                **(
                    {"bfcl": {"non_live_ast": 0.5, "missing": [], "simple": 0.5, **dict.fromkeys(CATEGORIES, 0.5)}}
                    if s.benchmark == "bfcl"
                    else {}
                ),
            },
        }

    monkeypatch.setattr(runner, "run_eval", fake_run_eval)
    monkeypatch.setattr(runner.EngineReuse, "get", lambda self, s: None)
    model = _fake_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "table"
    res = CliRunner().invoke(app, ["eval", "all", str(model), "--data-dir", str(data_dir), "--out", str(out),
                                   "--samples", "1", "--limit", "1"])
    assert res.exit_code == 0, res.output
    assert ran == ["aime24", "aime25", "hmmt25", "math500", "bfcl"]
    rows = {r["benchmark"]: r for r in json.loads((out / "paper_table.json").read_text())["rows"]}
    for bench, flag in (("gpqa_diamond", "--gpqa"), ("ifeval", "--ifeval")):
        assert not rows[bench]["run"] and rows[bench]["reason"].startswith("no data: ")
        assert f"rstar2 prepare eval-data {flag} FILE" in rows[bench]["reason"]
    assert rows["arena_hard"]["reason"].startswith("left out")
    # with the files prepared into a folder of their own (the math sets still come from the package)
    mine = tmp_path / "mydata"
    assert _prepare("--gpqa", FIXTURES / "gpqa_rows.jsonl", "--ifeval", FIXTURES / "ifeval_rows.jsonl",
                    "--out", mine).exit_code == 0
    ran.clear()
    res = CliRunner().invoke(app, ["eval", "all", str(model), "--data-dir", str(mine), "--out", str(tmp_path / "t2"),
                                   "--samples", "1", "--limit", "1"])
    assert res.exit_code == 0, res.output
    assert "gpqa_diamond" in ran and "ifeval" in ran and "no data" not in res.output


def test_one_benchmark_without_data_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    model = _fake_checkpoint(tmp_path / "ckpt")
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["eval", "ifeval", str(model), "--data-dir", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "benchmark ifeval: no data: run `rstar2 prepare eval-data --ifeval FILE" in res.output


def test_a_folder_named_like_a_benchmark_does_not_shadow_it(tmp_path, monkeypatch, data_dir):
    from rstar2_cli.commands import checks
    from rstar2_cli.eval.benchmarks import family_of
    from rstar2_cli.eval.settings import EvalSettings

    prepared = tmp_path / "d"
    assert _prepare("--ifeval", FIXTURES / "ifeval_rows.jsonl", "--out", prepared).exit_code == 0
    work = tmp_path / "work"
    (work / "ifeval").mkdir(parents=True)
    (work / "aime24").mkdir()
    monkeypatch.chdir(work)
    model = _fake_checkpoint(tmp_path / "ckpt")
    s = EvalSettings(benchmark="ifeval", model=str(model), data_dir=str(prepared))
    checks.eval_settings(s)                                     # no "a folder, not a file"
    assert len(family_of("ifeval").load(s)) == 6
    math = EvalSettings(benchmark="aime24", model=str(model), data_dir=str(data_dir))
    checks.eval_settings(math)
    assert len(family_of("aime24").load(math)) == 30


def test_context_follows_the_models_limit(tmp_path):
    from rstar2_cli.eval.settings import EvalSettings, context_length, model_context_limit

    small = _fake_checkpoint(tmp_path / "small", 2048)
    assert model_context_limit(str(small)) == 2048
    assert context_length(EvalSettings(benchmark="aime24", model=str(small), max_tokens=200)) == 2048
    assert context_length(EvalSettings(benchmark="aime24", model=str(small), max_tokens=30000)) == 2048
    big = _fake_checkpoint(tmp_path / "big", 40960)
    assert context_length(EvalSettings(benchmark="aime24", model=str(big), max_tokens=200)) == 2248
    assert context_length(EvalSettings(benchmark="aime24", model=str(big), max_tokens=200, max_model_len=4096)) == 4096
    res = CliRunner().invoke(app, ["eval", "aime24", str(small), "--max-model-len", "4096"])
    assert res.exit_code == 2 and "--max-model-len 4096: above MODEL" in res.output and "2048" in res.output
