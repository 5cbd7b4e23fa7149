"""The `prepare math` pipeline: filters, dedup, decontamination, outputs and provenance."""
from __future__ import annotations

import json
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rstar2_cli.cli import app

from rstar2_cli.data.prepare_math import PrepareMathConfig, SourceSpec, prepare_math, provenance_path
from rstar2_cli.data.problems import load_problems


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture()
def sources(tmp_path, data_dir):
    aime = load_problems("aime24", data_dir=data_dir, allow_hub=False)[5]
    a = [
        {
            "id": "ok",
            "problem": "Compute the number of divisors of 360 that are perfect squares.",
            "answer": "$\\boxed{4}$",
        },
        {"id": "frac", "problem": "Compute one half of one.", "answer": "\\frac{1}{2}"},
        {"id": "float", "problem": "Compute 2/19 times 10^18 to the nearest integer.", "answer": "105263157894736848"},
        {"id": "placeholder", "problem": "How many primes are less than 20?", "answer": "-1"},
        {"id": "dup1", "problem": "Find the sum of all digits of 2^10.", "answer": "7"},
        {"id": "dup2", "problem": "find the  sum of all digits of $2^10$.", "answer": "7"},
        {"id": "conf1", "problem": "What is the largest prime factor of 1001?", "answer": "13"},
        {"id": "conf2", "problem": "What is the largest prime factor of $1001$?", "answer": "11"},
        {"id": "copied", "problem": aime.problem, "answer": aime.answer},
        {
            "id": "zh",
            "problem": "求 1+2+3 的值。\n让我们一步一步地思考。"
            "请以“Answer: \\boxed{<final_answer>}”的格式输出最终答案。"
            "如果是选择题，请按顺序输出正确的选项，不带任何标点或空格。对于其他类型的问题，请只输出最终答案的数值。",
            "answer": "6",
        },
    ]
    b = [{"idx": "ok", "question": "Let N be the product of the first five primes. Compute N.", "gt": "2,310"}]
    _write_jsonl(tmp_path / "a.jsonl", a)
    _write_jsonl(tmp_path / "b.jsonl", b)
    return tmp_path


def test_pipeline_drops_each_class_and_writes_provenance(sources, data_dir, tmp_path):
    out = tmp_path / "out" / "math.jsonl"
    config = PrepareMathConfig(
        sources=[SourceSpec.parse(f"{sources / 'a.jsonl'}:MIT"),
                 SourceSpec(path=str(sources / "b.jsonl"), license="CC-BY-4.0", id_field="idx",
                            problem_field="question", answer_field="gt")],
        out=out, data_dir=str(data_dir))
    report = prepare_math(config)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["id"]: r["answer"] for r in rows} == {"a:ok": "4", "b:ok": "2310", "dup1": "7", "zh": "6"}
    assert set(rows[0]) == {"id", "problem", "answer", "source"}
    assert next(r for r in rows if r["id"] == "zh")["problem"] == "求 1+2+3 的值。"
    assert report.dropped == {"empty_problem": 0, "non_integer_answer": 1, "float_artifact_answer": 1,
                              "positive_placeholder_answer": 1, "exact_duplicate": 1, "answer_conflict": 2,
                              "near_duplicate": 0, "contaminated": 1}
    assert report.contamination_hits["aime24"] == 1 and report.conflict_groups == 1
    dropped = [json.loads(line) for line in out.with_name("math.jsonl.dropped.jsonl").read_text().splitlines()]
    assert {d["id"]: d["reason"] for d in dropped}["copied"] == "contaminated"
    prov = json.loads(provenance_path(out).read_text())
    assert [s["license"] for s in prov["sources"]] == ["MIT", "CC-BY-4.0"]
    assert prov["sources"][1]["fields"] == {"id_field": "idx", "problem_field": "question", "answer_field": "gt"}
    assert len(prov["sources"][0]["sha256"]) == 64 and prov["counts"]["kept"] == 4
    assert prov["settings"]["integer_only"] is True and prov["eval_sets"]["math500"] == 500


def test_parquet_output_and_no_integer_only(sources, data_dir, tmp_path):
    out = tmp_path / "math.parquet"
    config = PrepareMathConfig(sources=[SourceSpec(path=str(sources / "a.jsonl"))], out=out,
                               data_dir=str(data_dir), integer_only=False, eval_sets=["aime25"])
    report = prepare_math(config)
    table = pq.read_table(out)
    assert table.column_names == ["id", "problem", "answer", "source"]
    assert "\\frac{1}{2}" in table.column("answer").to_pylist()
    assert report.dropped["contaminated"] == 0  # only aime25 checked; the copy is from aime24


def test_config_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="must end in .jsonl or .parquet"):
        PrepareMathConfig(sources=[SourceSpec(path="x.jsonl")], out=tmp_path / "x.csv")
    with pytest.raises(ValueError):
        PrepareMathConfig(sources=[SourceSpec(path="x.jsonl")], out=tmp_path / "x.jsonl", near_dup_threshold=1.5)
    assert SourceSpec.parse("org/name:apache-2.0").license == "apache-2.0"
    assert SourceSpec.parse("/data/x.jsonl").license == "unknown"


def test_cli_with_yaml_spec(sources, data_dir, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"sources:\n  - path: {sources / 'b.jsonl'}\n    license: CC-BY-4.0\n"
                    f"    id_field: idx\n    problem_field: question\n    answer_field: gt\n"
                    f"eval_sets: [aime24]\ndata_dir: {data_dir}\n")
    out = tmp_path / "cli.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["prepare", "math", "--spec", str(spec), "--out", str(out), "--no-hub"])
    assert result.exit_code == 0, result.output
    assert "kept" in result.output and json.loads(out.read_text())["answer"] == "2310"
    bad = runner.invoke(app, ["prepare", "math", "--source", str(tmp_path / "missing.jsonl"), "--out", str(out)])
    assert bad.exit_code == 2 and "missing.jsonl: no such file" in bad.output


def _prepare_dapo(data_dir, out):
    config = PrepareMathConfig(sources=[SourceSpec.parse("dapo_math_17k:Apache-2.0")], out=out,
                               data_dir=str(data_dir), allow_hub=False)
    return prepare_math(config)


def test_dapo_pipeline_on_the_sample(data_dir, tmp_path):
    """Each filter on real rows (tests/data/fixtures/README.md says which row holds which case)."""
    out = tmp_path / "dapo.jsonl"
    report = _prepare_dapo(data_dir, out)
    assert report.loaded == {"dapo_math_17k": 55}
    assert report.dropped == {
        "empty_problem": 0, "non_integer_answer": 0, "float_artifact_answer": 3,
        "positive_placeholder_answer": 2, "exact_duplicate": 5, "answer_conflict": 8,
        "near_duplicate": 1, "contaminated": 8,
    }
    assert report.conflict_groups == 4
    assert report.kept == 55 - sum(report.dropped.values()) == 28
    kept = {json.loads(line)["id"] for line in out.read_text().splitlines()}
    assert {"dapo-00055", "dapo-00086", "dapo-00081", "dapo-05546"} <= kept
    assert not kept & {"dapo-01000", "dapo-05785", "dapo-00733", "dapo-00253", "dapo-00255", "dapo-01159"}


@pytest.mark.slow
def test_full_dapo_pipeline_counts(full_training_set_dir, tmp_path):
    out = tmp_path / "dapo.jsonl"
    report = _prepare_dapo(full_training_set_dir, out)
    assert report.loaded == {"dapo_math_17k": 17917}
    assert report.dropped == {
        "empty_problem": 0, "non_integer_answer": 0, "float_artifact_answer": 3,
        "positive_placeholder_answer": 4, "exact_duplicate": 891, "answer_conflict": 22,
        "near_duplicate": 821, "contaminated": 754,
    }
    # The 4 placeholder rows were the '-1' halves of 4 of the 15 conflicting groups, so their
    # partners (554, 230, 683, 913) survive and 11 conflicting groups remain.
    assert report.conflict_groups == 11
    assert report.kept == 17917 - sum(report.dropped.values())
    assert report.contamination_hits == {"aime24": 59, "aime25": 156, "math500": 528, "hmmt25": 28}
    assert report.kept == 15422
    kept_answers = {json.loads(line)["id"]: json.loads(line)["answer"] for line in out.read_text().splitlines()}
    assert kept_answers.get("dapo-10267") == "554"
