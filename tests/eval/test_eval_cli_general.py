"""`rstar2 eval` on the generalization sets: input errors are one line naming what to fix."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.data.problems import DataError
from rstar2_cli.eval.family import set_rows


def test_eval_all_refuses_one_data_file(tmp_path):
    res = CliRunner().invoke(app, ["eval", "all", str(tmp_path), "--data", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "eval all" in res.output and "--data-dir" in res.output


def test_gpqa_missing_locally_and_offline_says_how_to_log_in(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(DataError, match=r"hub:Idavidrein/gpqa: .*huggingface-cli login") as e:
        set_rows("gpqa_diamond", None, str(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bench,row,match", [
    ("gpqa_diamond", {"Question": "q", "Correct Answer": "a"}, r"gpqa\.jsonl:1: missing field 'Incorrect Answer 1'"),
    ("ifeval", {"key": 1, "prompt": "p", "instruction_id_list": ["no:such"], "kwargs": [{}]},
     r"ifeval\.jsonl:1: unknown IFEval instruction 'no:such'"),
    ("bfcl", {"id": "x_1", "question": [[{"role": "user", "content": "hi"}]], "function": [], "ground_truth": []},
     r"bfcl\.jsonl:1: field 'category'"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, bench, row, match):
    from rstar2_cli.eval.benchmarks import family_of
    from rstar2_cli.eval.settings import EvalSettings

    f = tmp_path / f"{bench.split('_')[0]}.jsonl"
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=match):
        family_of(bench).load(EvalSettings(benchmark=bench, model="m", data=str(f)))
